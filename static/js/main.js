// The explorer: analyse a prompt once, then look at it head by head and token by token.
import { $, el, fmt, showToken } from "./dom.js";
import { getAttentionBin, getJSON, postJSON, readSSE } from "./api.js";
import { state, set, toURL } from "./state.js";
import { renderTokens, markSelected } from "./views/tokens.js";
import { drawHeatmap, wireHover } from "./views/heatmap.js";
import { HeadGrid } from "./views/headgrid.js";
import { drawFocusBars, drawFocusLines } from "./views/focus.js";
import { drawNext, fetchNext } from "./views/nexttoken.js";
import { Tools } from "./tools/tools.js"; // causal tools (issue 17): attribution, ablation, patching, lens, residual, compare

const sliceCache = new Map(); // "run:layer:head" -> binary slice, for this page's runs
let hoverWired = false;

function showError(message) {
  const box = $("#error");
  box.textContent = message;
  box.hidden = !message;
}

function busy(on) {
  $("#busy").hidden = !on;
  $("#analyze").disabled = on;
}

function fillSelect(select, count, prefix, value) {
  select.replaceChildren(...Array.from({ length: count }, (_, i) => el("option", { value: String(i), text: `${prefix} ${i}` })));
  select.value = String(value);
}

function describeModel(m) {
  const kv = m.n_kv_heads !== m.n_heads ? ` (${m.n_kv_heads} K/V heads)` : "";
  return `${m.name}: ${m.architecture}, ${m.n_layers} layers × ${m.n_heads} heads${kv}, d_model ${m.d_model} = ` +
    `${m.n_heads} × ${m.d_head}, vocab ${m.vocab_size}, ${m.position_encoding} positions, ` +
    `${m.causal ? "decoder (causal mask)" : "encoder (full attention)"}, ${(m.n_params / 1e6).toFixed(1)}M parameters`;
}

async function loadSlice() {
  const { run, layer, head } = state;
  const key = `${run.run_id}:${layer}:${head}`;
  if (!sliceCache.has(key)) sliceCache.set(key, getAttentionBin(run.run_id, layer, head));
  try {
    return await sliceCache.get(key);
  } catch (err) {
    sliceCache.delete(key);
    throw err;
  }
}

async function drawHead() {
  const { run, layer, head } = state;
  const slice = await loadSlice();
  if (state.run !== run || state.layer !== layer || state.head !== head) return; // a newer choice won
  state.slice = slice;
  const score = run.heads.find((h) => h.layer === layer && h.head === head);
  const title = `layer ${layer}, head ${head} · entropy ${fmt(score.entropy, 2)} · prev-token ${fmt(score.prev_token, 2)} · ` +
    `first-token ${fmt(score.first_token, 2)}${score.induction === null ? "" : ` · induction ${fmt(score.induction, 2)}`}`;
  $("#heat-title").textContent = `${run.tokens.length} tokens`;
  const div = $("#heatmap");
  await drawHeatmap(div, slice, run.tokens, { colour: state.colour, title });
  div.dataset.n = String(slice.n);
  div.dataset.layer = String(layer);
  div.dataset.head = String(head);
  div.dataset.drawnAt = String(performance.now()); // read by bench/browser.py
  if (!hoverWired) {
    wireHover(div, $("#heat-tip"), () => state);
    div.on("plotly_click", (ev) => {
      const pt = ev.points.find((p) => p.data.type === "heatmap");
      if (pt) selectPos(pt.y);
    });
    hoverWired = true;
  }
  $("#layer-picker").value = String(layer);
  $("#head-picker").value = String(head);
  drawFocus();
  toURL();
}

function drawFocus() {
  const { run, slice, pos, layer, head } = state;
  if (!slice) return;
  $("#focus-title").textContent = `token ${pos} ${showToken(run.tokens[pos].text)} · layer ${layer} head ${head}`;
  drawFocusBars($("#focus-chart"), slice, run.tokens, pos);
  drawFocusLines($("#focus-lines"), slice, run.tokens, pos);
}

let nextTimer = null;
function drawNextSoon(delay = 0) {
  clearTimeout(nextTimer);
  nextTimer = setTimeout(async () => {
    const { run, pos, temperature } = state;
    const panel = $(".next-panel");
    if (!state.model || !state.model.has_lm_head) {
      panel.hidden = true;
      return;
    }
    panel.hidden = false;
    $("#next-title").textContent = `after token ${pos} ${showToken(run.tokens[pos].text)}`;
    try {
      const next = await fetchNext(run.run_id, pos, temperature);
      if (state.run === run && state.pos === pos) drawNext($("#next-chart"), $("#next-actual"), next);
    } catch (err) {
      showError(err.message);
    }
  }, delay);
}

function selectPos(pos) {
  set({ pos });
  markSelected($("#tokens"), pos);
  drawFocus();
  drawNextSoon();
  toURL();
  tools.update("pos", state);
}

async function selectHead(layer, head) {
  set({ layer, head });
  grid.select(layer, head);
  try {
    await drawHead();
  } catch (err) {
    showError(err.message);
  }
  tools.update("head", state);
}

const grid = new HeadGrid($("#head-grid"), (layer, head) => selectHead(layer, head));
const tools = new Tools($("#tools"), { selectHead, error: showError, prompt: () => $("#prompt").value });

async function analyse(initial = {}) {
  const text = $("#prompt").value;
  const modelName = $("#model-picker").value || undefined;
  showError("");
  busy(true);
  try {
    const run = await postJSON("/api/runs", { text, model: modelName, top_k: 10 });
    await loadRun(run, initial);
  } catch (err) {
    showError(err.message);
  } finally {
    busy(false);
  }
}

async function loadRun(run, initial = {}) {
  const model = state.models.find((m) => m.name === run.model);
  const clamp = (v, hi, dflt) => (Number.isInteger(v) && v >= 0 && v < hi ? v : dflt);
  const layer = clamp(initial.layer, run.n_layers, 0);
  const head = clamp(initial.head, run.n_heads, 0);
  const pos = clamp(initial.pos, run.tokens.length, run.tokens.length - 1);
  set({ run, model, layer, head, pos, slice: null });
  $("#explorer").hidden = false;
  renderTokens($("#tokens"), run, selectPos);
  markSelected($("#tokens"), pos);
  fillSelect($("#layer-picker"), run.n_layers, "layer", layer);
  fillSelect($("#head-picker"), run.n_heads, "head", head);
  $("#model-summary").textContent = describeModel(model);
  $("#timeline-box").hidden = true;
  await drawHead();
  if (initial.steps) {
    const tl = $("#timeline");
    tl.max = String(initial.steps);
    tl.value = String(initial.steps);
    $("#timeline-value").textContent = `all ${initial.steps} generated tokens`;
    $("#timeline-box").hidden = false; // shown once the full run is drawn
  }
  grid.render(run, $("#grid-sort").value, { layer, head }, model);
  drawNextSoon();
  loadSparsity(run);
  tools.update("run", state);
}

async function loadSparsity(run) {
  try {
    const { heads } = await getJSON(`/api/runs/${encodeURIComponent(run.run_id)}/sparsity`);
    if (state.run !== run) return;
    heads.forEach((s, i) => Object.assign(run.heads[i], s));
    grid.annotate(run);
  } catch (err) {
    showError(err.message);
  }
}

// Generate with the KV cache, recording every step: the heatmap fills row by row as
// tokens stream in, then the recording becomes an ordinary run with a timeline.
async function generateAndRecord() {
  if (!state.run) await analyse();
  if (!state.run || !state.model.has_lm_head) return;
  const text = $("#prompt").value;
  const body = { text, model: state.run.model, max_new_tokens: Number($("#gen-count").value), temperature: Number($("#gen-temp").value),
                 top_k: 0, top_p: 1, seed: 0, record: true, watch_layer: state.layer, watch_head: state.head };
  const { layer, head } = state;
  showError("");
  busy(true);
  const rows = [];
  const tokens = state.run.tokens.slice();
  const live = () => {
    const n = rows.length;
    const data = new Float32Array(n * (n + 1) / 2);
    let k = 0;
    for (const r of rows) for (const v of r) data[k++] = v;
    return { n, heads: 1, causal: true, size: null, data };
  };
  try {
    const r = await fetch("/api/generate", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
    if (!r.ok) throw new Error((await r.json()).message);
    let runId = null;
    let steps = 0;
    for await (const ev of readSSE(r)) {
      if (ev.data.rows) rows.push(...ev.data.rows);
      if (ev.event === "token") {
        steps += 1;
        tokens.push({ index: tokens.length, id: ev.data.id, text: ev.data.token, start: 0, end: 0 });
      }
      if (ev.event === "run") runId = ev.data.run_id;
      if (rows.length) {
        await drawHeatmap($("#heatmap"), live(), tokens.slice(0, rows.length), { colour: state.colour, title: `recording · layer ${layer} head ${head} · ${rows.length} rows` });
        $("#heatmap").dataset.liveRows = String(rows.length);
      }
    }
    const run = await getJSON(`/api/runs/${encodeURIComponent(runId)}`);
    $("#prompt").value = run.text; // prompt + generated text, each character once
    await loadRun(run, { layer, head, pos: run.tokens.length - 1, steps });
  } catch (err) {
    showError(err.message);
  } finally {
    busy(false);
  }
}

// Step back through a recorded generation: show the rows that existed after step k.
function showStep(k) {
  const { run, slice } = state;
  const total = Number($("#timeline").max);
  const n = run.tokens.length - (total - k);
  $("#timeline-value").textContent = k === total ? `all ${total} generated tokens` : `after ${k} of ${total} generated tokens`;
  const data = slice.data.subarray(0, (n * (n + 1)) / 2);
  drawHeatmap($("#heatmap"), { ...slice, n, data }, run.tokens.slice(0, n), { colour: state.colour, title: `layer ${state.layer}, head ${state.head} · step ${k}` });
}

function zoom() {
  const n = state.run.tokens.length;
  const get = (id, dflt) => { const v = $(id).value; return v === "" ? dflt : Math.max(0, Math.min(n - 1, Number(v))); };
  const [q0, q1, k0, k1] = [get("#zoom-q0", 0), get("#zoom-q1", n - 1), get("#zoom-k0", 0), get("#zoom-k1", n - 1)];
  window.Plotly.relayout($("#heatmap"), { "xaxis.range": [k0 - 0.5, k1 + 0.5], "yaxis.range": [q1 + 0.5, q0 - 0.5] });
}

function download(name, blob) {
  const url = URL.createObjectURL(blob);
  const a = el("a", { href: url, download: name });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

async function init() {
  const { models } = await getJSON("/api/models");
  set({ models });
  const picker = $("#model-picker");
  picker.replaceChildren(...models.map((m) => el("option", { value: m.name, text: `${m.name}${m.causal ? "" : " (encoder)"}` })));
  const dflt = models.find((m) => m.default);
  if (dflt) picker.value = dflt.name;

  $("#analyze").addEventListener("click", () => analyse());
  $("#prompt").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) analyse();
  });
  for (const b of document.querySelectorAll(".example")) {
    b.addEventListener("click", () => { $("#prompt").value = b.dataset.example; analyse(); });
  }
  $("#layer-picker").addEventListener("change", (ev) => selectHead(Number(ev.target.value), state.head));
  $("#head-picker").addEventListener("change", (ev) => selectHead(state.layer, Number(ev.target.value)));
  $("#colour-scale").addEventListener("change", (ev) => { set({ colour: ev.target.value }); drawHead(); });
  $("#grid-sort").addEventListener("change", (ev) => state.run && grid.render(state.run, ev.target.value, state, state.model));
  $("#temperature").addEventListener("input", (ev) => {
    const t = Number(ev.target.value);
    $("#temperature-value").textContent = t.toFixed(2);
    set({ temperature: t });
    drawNextSoon(60);
  });
  $("#export-png").addEventListener("click", () =>
    window.Plotly.downloadImage($("#heatmap"), { format: "png", filename: `attnscope-L${state.layer}H${state.head}`, scale: 2 }));
  $("#export-svg").addEventListener("click", () =>
    window.Plotly.downloadImage($("#heatmap"), { format: "svg", filename: `attnscope-L${state.layer}H${state.head}` }));
  $("#grid-png").addEventListener("click", () => grid.exportImage("png").then((blob) => download("attnscope-heads.png", blob)));
  $("#grid-svg").addEventListener("click", () => grid.exportImage("svg").then((blob) => download("attnscope-heads.svg", blob)));
  $("#generate").addEventListener("click", generateAndRecord);
  $("#timeline").addEventListener("input", (ev) => showStep(Number(ev.target.value)));
  $("#zoom-apply").addEventListener("click", zoom);
  $("#zoom-reset").addEventListener("click", () => drawHead());
  $("#export-json").addEventListener("click", async () => {
    if (!state.run) return;
    const r = await fetch(`/api/runs/${encodeURIComponent(state.run.run_id)}/export`);
    if (!r.ok) return showError((await r.json()).message);
    download(`attnscope-run-${state.run.run_id}.json`, await r.blob());
  });

  const params = new URLSearchParams(location.search);
  if (params.get("model") && models.some((m) => m.name === params.get("model"))) picker.value = params.get("model");
  if (params.get("text")) {
    $("#prompt").value = params.get("text");
    const num = (k) => (params.has(k) ? Number(params.get(k)) : undefined);
    await analyse({ layer: num("layer"), head: num("head"), pos: num("pos") });
  } else {
    $("#prompt").value = "I love artificial intelligence";
  }
}

function start() {
  init().catch((err) => showError(`Could not start: ${err.message}`));
}
// plotly.min.js is a deferred classic script; modules run after it
if (window.Plotly) start();
else window.addEventListener("load", start);
