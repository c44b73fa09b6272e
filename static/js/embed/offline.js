// Runs inside a run's standalone HTML file (app/standalone.py), before anything else: it inflates
// the file's one payload (plotly.js, the stylesheets, the explorer's modules and the run's data),
// starts the page from it, and answers the page's fetch("/api/...") from what the file holds:
// the answers recorded when it was saved, and what follows from the exact cells of the heads it
// keeps (a head's bytes, any tile of them: thumbnails, a token's focus row, a long run's zooms).
// Anything else answers the error code "offline_head" (a head whose cells it does not keep) or
// "offline_file" (err.<code> in static/i18n), which the page shows in the reader's language. No request leaves the page. A classic script, ASCII only.
(() => {
  const realFetch = window.fetch.bind(window);

  // The payload: single bytes of a windows-1252 document, "=" escaping what an HTML parser would
  // lose (CR) or stop at ("<" before "/" or "!"), and "=" itself (app/standalone.py's escape); the
  // parser reads NUL as U+FFFD, which no byte decodes to.
  function payloadBytes() {
    const text = document.getElementById("attnscope-payload").textContent;
    const decoded = new TextDecoder("windows-1252").decode(Uint8Array.from({ length: 256 }, (_, i) => i));
    const byteOf = new Uint8Array(65536); // a character's code -> the byte it decodes from
    for (let i = 0; i < 256; i++) byteOf[decoded.charCodeAt(i)] = i;
    byteOf[0xfffd] = 0;
    const out = new Uint8Array(text.length);
    let n = 0;
    for (let i = 0; i < text.length; i++) {
      let b = byteOf[text.charCodeAt(i)];
      if (b === 61 && i + 1 < text.length) b = (byteOf[text.charCodeAt(++i)] + 192) & 255; // "=" x: x - 64
      out[n++] = b;
    }
    return out.subarray(0, n);
  }

  async function inflate(bytes) {
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return new Uint8Array(await new Response(stream).arrayBuffer());
  }

  function unshuffle(planes) { // four byte planes back to interleaved float32 bytes
    const count = planes.length / 4, out = new Uint8Array(planes.length);
    for (let p = 0; p < 4; p++) for (let i = 0; i < count; i++) out[i * 4 + p] = planes[p * count + i];
    return out;
  }

  function toBase64(bytes) {
    let s = "";
    for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
    return btoa(s);
  }

  // each step is marked ("attnscope:offline-<step>") for the Performance panel and the benchmarks
  async function open() {
    const bytes = payloadBytes();
    performance.mark("attnscope:offline-read");
    const all = await inflate(bytes);
    performance.mark("attnscope:offline-inflated");
    const length = new DataView(all.buffer, all.byteOffset).getUint32(0);
    const manifest = JSON.parse(new TextDecoder().decode(all.subarray(4, 4 + length)));
    const blob = ([offset, size]) => all.subarray(4 + length + offset, 4 + length + offset + size);
    const text = (where) => new TextDecoder().decode(blob(where));
    const exact = new Map(Object.entries(manifest.exact).map(([k, w]) => [k, new Float32Array(unshuffle(blob(w)).buffer)]));
    for (const where of manifest.css) {
      const style = document.createElement("style");
      style.textContent = text(where);
      document.head.append(style);
    }
    const plotly = document.createElement("script");
    plotly.textContent = text(manifest.plotly);
    document.head.append(plotly); // an inline classic script runs as it is inserted
    const imports = {};
    for (const [name, where] of Object.entries(manifest.modules)) imports[name] = `data:text/javascript;base64,${toBase64(blob(where))}`;
    const map = document.createElement("script");
    map.type = "importmap";
    map.textContent = JSON.stringify({ imports });
    document.head.append(map);
    if (document.readyState === "loading") { // the page's elements, all parsed, as a module script expects
      await new Promise((resolve) => document.addEventListener("DOMContentLoaded", resolve, { once: true }));
    }
    performance.mark("attnscope:offline-started");
    const main = document.createElement("script");
    main.type = "module";
    main.textContent = 'import "attnscope/js/main.js";';
    document.body.append(main);
    return { manifest, blob, exact, run: manifest.run };
  }

  // ---- answers ---------------------------------------------------------------------------------

  const enc = (s) => encodeURIComponent(s);
  function key(method, url) {
    const params = [...url.searchParams].filter(([k]) => k !== "wait").sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return `${method} ${url.pathname}?${params.map(([k, v]) => `${enc(k)}=${enc(v)}`).join("&")}`;
  }

  const refusal = (body) => new Response(JSON.stringify(body), { status: 404, statusText: "Not in this file", headers: { "content-type": "application/json" } });

  function offline(method, url) {
    const request = `${method} ${url.pathname}`;
    return refusal({ code: "offline_file", message: "This file holds only what was saved with it: this needs the attnscope server and the model.", params: { request } });
  }

  // a head whose exact cells the file does not keep (a long run's file keeps the heads asked for)
  function notKept(data, url) {
    const p = url.searchParams, layer = integer(p.get("layer")), head = p.has("head") ? integer(p.get("head")) : 0;
    if (url.pathname !== `/api/runs/${encodeURIComponent(data.run.run_id)}/attention` || layer === null || head === null) return null;
    const heads = data.exact.size ? [...data.exact.keys()] : data.run.overview; // exact cells, else overviews
    const kept = heads.map((k) => `L${k.replace(".", "H")}`).join(", ");
    return refusal({
      code: "offline_head", params: { layer, head, kept },
      message: `this file keeps the attention of ${kept} (and every head's thumbnail): this view of L${layer}H${head} needs the run on an attnscope server`,
    });
  }

  function recorded(data, k) {
    const hit = data.manifest.responses[k];
    if (!hit) return null;
    const body = data.blob(hit.body);
    return new Response(hit.shuffled ? unshuffle(body) : body.slice(), { status: hit.status, headers: hit.headers });
  }

  // round half to even, as torch.round does
  function roundEven(x) {
    const r = Math.round(x);
    return Math.abs(x % 1) === 0.5 && r % 2 !== 0 ? r - 1 : r;
  }
  // a weight as the server's bytes say it, computed in float32 as the server does: (q/scale)^2
  const u8 = (w, scale) => roundEven(Math.fround(Math.fround(Math.sqrt(Math.min(1, Math.max(0, w)))) * scale));

  const integer = (v) => (v !== null && /^-?\d+$/.test(v) ? Number(v) : null);

  // What the server would answer for the attention of kept heads: whole heads (format=bin / f32,
  // the same bytes) and tiles, exact or pooled (a focus row, thumbnails, a long run's overview and
  // zooms: the server computes tiles from the run's Q and K, so they agree within float32 rounding).
  // null: not derivable here (a head not kept).
  function derive(data, path, p) {
    const run = data.run;
    if (path !== `/api/runs/${encodeURIComponent(run.run_id)}/attention`) return null;
    const format = p.get("format");
    const layer = integer(p.get("layer")), head = p.has("head") ? integer(p.get("head")) : null;
    if ((format !== "bin" && format !== "f32") || layer === null || (p.has("head") && head === null)) return null;
    const heads = head === null ? Array.from({ length: run.n_heads }, (_, h) => h) : [head];
    const cells = heads.map((h) => data.exact.get(`${layer}.${h}`));
    if (cells.some((c) => !c)) return null;
    const n = run.n, size = p.has("size") ? integer(p.get("size")) : null;
    const headers = {
      "content-type": "application/octet-stream", "x-attn-n": String(n), "x-attn-heads": String(heads.length),
      "x-attn-causal": run.causal ? "1" : "0", "x-attn-layer": String(layer), "x-attn-head": head === null ? "all" : String(head),
    };
    const tiled = ["q0", "q1", "k0", "k1", "pool"].some((k) => p.has(k)) || (size !== null && head !== null);
    if (!tiled) {
      if (size !== null && n > size) return null; // a pooled thumbnail: recorded, when it was
      const all = new Float32Array(cells.reduce((s, c) => s + c.length, 0));
      cells.reduce((at, c) => { all.set(c, at); return at + c.length; }, 0);
      headers["x-attn-encoding"] = format === "bin" ? "sqrt-u8" : "f32";
      const body = format === "bin" ? Uint8Array.from(all, (w) => u8(w, 255)) : new Uint8Array(all.buffer);
      return new Response(body, { status: 200, headers });
    }
    const span = (a, b) => [p.has(a) ? integer(p.get(a)) : 0, p.has(b) ? integer(p.get(b)) : n];
    const [q0, q1] = span("q0", "q1"), [k0, k1] = span("k0", "k1");
    const pool = p.get("pool") || "max";
    if ([q0, q1, k0, k1].some((v) => v === null) || !(q0 >= 0 && q0 < q1 && q1 <= n && k0 >= 0 && k0 < k1 && k1 <= n)) return null;
    if ((size !== null && size < 2) || (pool !== "max" && pool !== "mean")) return null;
    // bins as the server cuts them: bin i of [a, b) covers [a + floor(i*R/S), a + floor((i+1)*R/S))
    const binOf = (a, b) => {
      const r = b - a, s = size === null ? r : Math.min(size, r), of = new Int32Array(r);
      for (let i = 0; i < s; i++) of.fill(i, Math.floor((i * r) / s), Math.floor(((i + 1) * r) / s));
      return [of, s];
    };
    const [qBin, rows] = binOf(q0, q1), [kBin, cols] = binOf(k0, k1);
    const exactTile = rows === q1 - q0 && cols === k1 - k0;
    // each bin pools its visible cells: the max, or the mean; NaN where none is visible
    const values = new Float32Array(heads.length * rows * cols).fill(NaN);
    const sums = pool === "mean" ? new Float64Array(values.length) : null, counts = sums && new Int32Array(values.length);
    const start = (q) => (run.causal ? (q * (q + 1)) / 2 : q * n);
    cells.forEach((c, h) => {
      for (let q = q0; q < q1; q++) {
        const row = start(q), at = (h * rows + qBin[q - q0]) * cols, end = run.causal ? Math.min(k1, q + 1) : k1;
        for (let k = k0; k < end; k++) {
          const v = c[row + k], i = at + kBin[k - k0];
          if (sums) { sums[i] += v; counts[i] += 1; } else if (!(values[i] >= v)) values[i] = v;
        }
      }
    });
    if (sums) for (let i = 0; i < values.length; i++) if (counts[i]) values[i] = sums[i] / counts[i];
    Object.assign(headers, {
      "x-attn-encoding": format === "bin" ? "sqrt-u8-tile" : "f32-tile", "x-attn-q0": String(q0), "x-attn-q1": String(q1),
      "x-attn-k0": String(k0), "x-attn-k1": String(k1), "x-attn-rows": String(rows), "x-attn-cols": String(cols),
      "x-attn-pool": pool, "x-attn-exact": exactTile ? "1" : "0", "x-attn-masked": format === "bin" ? "255" : "NaN",
    });
    const body = format === "bin" ? Uint8Array.from(values, (w) => (Number.isNaN(w) ? 255 : u8(w, 254))) : new Uint8Array(values.buffer);
    return new Response(body, { status: 200, headers });
  }

  async function answer(data, method, url, body) {
    if (method === "POST" && url.pathname === "/api/runs") { // the page analyses its prompt: the saved run's
      let asked = {};
      try { asked = JSON.parse(body || "{}"); } catch { /* not JSON: not the saved run */ }
      const same = asked.text === data.run.text && (asked.model === undefined || asked.model === data.run.model) && !asked.messages;
      return same ? recorded(data, "POST /api/runs?") : offline(method, url);
    }
    if (method === "GET") {
      const hit = recorded(data, key(method, url)) || derive(data, url.pathname, url.searchParams) || notKept(data, url);
      if (hit) return hit;
    }
    return offline(method, url);
  }

  const ready = open();
  ready.catch((err) => { document.body.prepend(Object.assign(document.createElement("p"), { textContent: `This file could not be opened: ${err}` })); });

  window.fetch = async (input, init = {}) => {
    const raw = typeof input === "string" ? input : input.url;
    if (!raw.startsWith("/")) return realFetch(input, init);
    const data = await ready;
    if (init.signal && init.signal.aborted) throw new DOMException("The request was aborted", "AbortError");
    return answer(data, (init.method || "GET").toUpperCase(), new URL(raw, "http://offline.invalid"), init.body);
  };
})();
