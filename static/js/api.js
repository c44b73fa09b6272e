// The JSON API, and the compact binary attention slices.

// A refusal from the server: its HTTP status, its English message, and the stable code and params
// that say it in another language (i18n.js's errorText). status 0, code "network": no answer came.
export class ApiError extends Error {
  constructor(status, message, code = null, params = {}) {
    super(message);
    this.status = status;
    this.code = typeof code === "string" ? code : null;
    this.params = params && typeof params === "object" && !Array.isArray(params) ? params : {};
  }
}

// The response, or (not ok) the server's refusal as an ApiError: {code, message, params}, else the status line.
export async function check(response) {
  if (response.ok) return response;
  let message = `${response.status} ${response.statusText}`, code = null, params = {};
  try {
    const body = await response.json();
    if (body.message) message = body.message;
    else if (typeof body.detail === "string") message = body.detail;
    code = body.code;
    params = body.params;
  } catch (_) { /* not JSON: keep the status line */ }
  throw new ApiError(response.status, message, code, params);
}

// fetch, whose failure to reach the server at all is an ApiError with code "network" (an abort stays
// an AbortError: a newer request replaced it on purpose).
// A GET answered 503 with a short Retry-After (a run another worker is still writing, a busy model) is
// asked again after that wait, three times at most, before its refusal is shown.
export async function request(url, init = {}) {
  for (let attempt = 0; ; attempt += 1) {
    let response;
    try {
      response = await fetch(url, init);
    } catch (err) {
      if (err && err.name === "AbortError") throw err;
      throw new ApiError(0, String(err && err.message ? err.message : err), "network");
    }
    const wait = Number(response.headers.get("Retry-After"));
    const get = !init.method || init.method === "GET";
    if (response.status !== 503 || !get || attempt >= 3 || !(wait > 0 && wait <= 5)) return response;
    await new Promise((resolve) => setTimeout(resolve, wait * 1000));
    if (init.signal && init.signal.aborted) throw new DOMException("aborted", "AbortError");
  }
}

// Every fetch may carry an AbortSignal: a newer request aborts the one it replaces.
export async function getJSON(url, { signal } = {}) {
  return (await check(await request(url, { signal }))).json();
}

export async function postJSON(url, body, { signal } = {}) {
  const r = await request(url, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body), signal });
  return (await check(r)).json();
}

// A streamed POST (Server-Sent Events) whose errors read like the JSON API's.
export async function postStream(url, body, { signal } = {}) {
  return check(await request(url, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body), signal }));
}

// A file download (the run export) with the same error check as the JSON calls.
export async function getBlob(url, { signal } = {}) {
  return (await check(await request(url, { signal }))).blob();
}

// Every head's scores, once the ones computed after the analyse (entropy, max) are in: the server
// holds each request up to `wait` seconds and answers 202 while they are still owed.
export async function waitHeads(runId, { wait = 30, signal } = {}) {
  for (;;) {
    const r = await check(await request(`/api/runs/${encodeURIComponent(runId)}/heads?wait=${wait}`, { signal }));
    const body = await r.json();
    if (r.status !== 202) return body;
  }
}

// The exact weights of one head (format=f32): what hover reads, where the bytes are for drawing.
export async function getAttentionF32(runId, layer, head) {
  const params = new URLSearchParams({ layer, head, format: "f32" });
  const r = await check(await request(`/api/runs/${encodeURIComponent(runId)}/attention?${params}`));
  return new Float32Array(await r.arrayBuffer());
}

// Binary layout (see /docs): one byte q per visible cell, weight = (q/255)^2, row-major by
// query; causal rows hold i+1 keys. Returns {n, heads, causal, size, data: Float32Array}.
export async function getAttentionBin(runId, layer, head = null, size = null, { signal } = {}) {
  const params = new URLSearchParams({ layer, format: "bin" });
  if (head !== null) params.set("head", head);
  if (size !== null) params.set("size", size);
  const r = await check(await request(`/api/runs/${encodeURIComponent(runId)}/attention?${params}`, { signal }));
  const bytes = new Uint8Array(await r.arrayBuffer());
  const data = new Float32Array(bytes.length);
  for (let i = 0; i < bytes.length; i++) { const v = bytes[i] / 255; data[i] = v * v; }
  return {
    n: Number(r.headers.get("x-attn-n")),
    heads: Number(r.headers.get("x-attn-heads")),
    causal: r.headers.get("x-attn-causal") === "1",
    size: r.headers.get("x-attn-size") ? Number(r.headers.get("x-attn-size")) : null,
    data,
  };
}

// Bin boundaries of [a, b) cut into min(size, b - a) bins, as the server cuts them (see /docs):
// bin i covers [a + floor(i*R/S), a + floor((i+1)*R/S)).
export function tileEdges(a, b, size = null) {
  const r = b - a, s = size === null ? r : Math.min(size, r);
  return Int32Array.from({ length: s + 1 }, (_, i) => a + Math.floor((i * r) / s));
}

// A tile of one head (or of every head of a layer, head = null): queries [q0, q1) x keys [k0, k1)
// as at most size x size bins, each the max (or mean) of its visible cells. format "f32": exact
// float32 values; "bin": one byte a bin, (q/254)^2, 255 for a masked bin. Returns
// {heads, rows, cols, q0, q1, k0, k1, qEdges, kEdges, pool, exact, causal, n, eightBit,
// values: Float32Array(heads * rows * cols), NaN where every cell of a bin is masked}.
export async function getTile(runId, { layer, head = null, q0, q1, k0, k1, size = null, pool = "max", format = "f32" },
                              { signal } = {}) {
  const params = new URLSearchParams({ layer, format, pool, q0, q1, k0, k1 });
  if (head !== null) params.set("head", head);
  if (size !== null) params.set("size", size);
  const r = await check(await request(`/api/runs/${encodeURIComponent(runId)}/attention?${params}`, { signal }));
  const buffer = await r.arrayBuffer();
  const h = (name) => r.headers.get(`x-attn-${name}`);
  let values;
  if (format === "f32") {
    values = new Float32Array(buffer);
  } else {
    const bytes = new Uint8Array(buffer);
    const masked = Number(h("masked") ?? 255);
    values = new Float32Array(bytes.length);
    for (let i = 0; i < bytes.length; i++) {
      const q = bytes[i];
      values[i] = q === masked ? NaN : (q / 254) * (q / 254);
    }
  }
  const tile = {
    heads: Number(h("heads")), rows: Number(h("rows")), cols: Number(h("cols")),
    q0: Number(h("q0")), q1: Number(h("q1")), k0: Number(h("k0")), k1: Number(h("k1")),
    pool: h("pool"), exact: h("exact") === "1", causal: h("causal") === "1", n: Number(h("n")),
    eightBit: format !== "f32", size, values,
  };
  tile.qEdges = tileEdges(tile.q0, tile.q1, size);
  tile.kEdges = tileEdges(tile.k0, tile.k1, size);
  if (tile.qEdges.length !== tile.rows + 1 || tile.kEdges.length !== tile.cols + 1 ||
      values.length !== tile.heads * tile.rows * tile.cols) {
    throw new ApiError(r.status, `the tile's shape (${tile.heads} x ${tile.rows} x ${tile.cols}) does not match its ${values.length} values`);
  }
  return tile;
}

// The exact weights of one query row over keys [k0, k1) (no pooling): what token focus reads.
export async function getRow(runId, layer, head, q, k0, k1, { signal } = {}) {
  const tile = await getTile(runId, { layer, head, q0: q, q1: q + 1, k0, k1, format: "f32" }, { signal });
  return tile.values;
}

// The next-token distribution at `pos`, re-scaled by `temperature` on the server (exactly, over
// the whole vocabulary): its k most likely tokens, and the token the text went on with.
export async function getNext(runId, pos, temperature, k = 10) {
  const params = new URLSearchParams({ position: pos, temperature, top_k: k });
  return getJSON(`/api/runs/${encodeURIComponent(runId)}/next?${params}`);
}

// Server-Sent Events from a fetch() response (EventSource cannot POST): yields {event, data}. An
// "error" event (a failure after the stream started: the server ends the stream with it) is thrown
// as an ApiError with the server's status, message, code and params, so that every reader stops and says it.
export async function* readSSE(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const fields = Object.fromEntries(block.split("\n").map((l) => [l.slice(0, l.indexOf(":")), l.slice(l.indexOf(":") + 2)]));
      const data = JSON.parse(fields.data);
      if (fields.event === "error") throw new ApiError(data.status || 500, data.message, data.code, data.params);
      yield { event: fields.event, data };
    }
  }
}
