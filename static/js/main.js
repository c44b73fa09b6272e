// The explorer: analyse a prompt once, then look at it head by head and token by token.
import { $, el, fmt, plotlyText, showToken } from "./dom.js";
import { getAttentionBin, getAttentionF32, getBlob, getJSON, getRow, isAbort, postJSON, postStream, readSSE, rowOf, waitHeads } from "./api.js";
import { state, set, toURL, fromURL } from "./state.js";
import { renderTokens, markSelected } from "./views/tokens.js";
import { cellText, drawHeatmap, rangesFrom, tickBudget, ticks, wireHover } from "./views/heatmap.js";
import { HeadGrid, inductionText, pending, scoreText } from "./views/headgrid.js";
import { LiveHeatmap } from "./views/live.js";
import { drawFocusBars, drawFocusLines, focusNote } from "./views/focus.js";
import { EXACT_MAX, TileView, binOf, binText, poolingText, windowFrom } from "./views/tiled.js";
import { drawNext, fetchNext } from "./views/nexttoken.js";
import { errorText, initLanguage, lang, onLanguage, sentences, serverError, t } from "./i18n.js";
import { urlExtras } from "./state.js";
import { Tools } from "./tools/tools.js"; // causal tools (issue 17): attribution, ablation, patching, lens, residual, compare

const sliceCache = new Map(); // "run:layer:head" -> binary slice, for this page's runs
const exactCache = new Map(); // "run:layer:head" -> exact float32 cells, for hover
const DEFAULT_PROMPT = "I love artificial intelligence";
let hoverWired = false;
let lastWheel = -Infinity; // wheel zooms come in bursts: their tile waits for the burst to settle

// A long run (more than EXACT_MAX tokens) is drawn from tiles: an overview first, finer as one zooms.
const isLong = (run) => run.tokens.length > EXACT_MAX;

// ---- errors and the one request in flight ------------------------------------------------

// offer: a way forward shown as a button after the message, {key, vars, run}
let lastError = "", lastOffer = null;
function showError(message, offer = null) {
  lastError = message || "";
  lastOffer = lastError ? offer : null;
  const box = $("#error");
  box.replaceChildren(errorText(lastError));
  if (lastOffer) {
    box.append(" ", el("button", { type: "button", class: "offer", "data-testid": "error-offer",
                                   text: t(lastOffer.key, lastOffer.vars), onclick: lastOffer.run }));
  }
  box.hidden = !lastError;
}

// A prompt over the model's token limit: the limit, read from the server's refusal (null: another error).
// Every such refusal (counted whole, "at least", or by its characters) names the limit second.
const TOO_LONG = new Set(["err.too_long", "err.too_long_at_least_read", "err.too_long_at_least_length",
                          "err.too_long_at_least", "err.too_long_chars"]);
function tokenLimitOf(err) {
  const hit = err && err.status === 422 ? serverError(err.message) : null;
  return hit && TOO_LONG.has(hit.key) ? Number(hit.values[1]) : null;
}

// What a truncated run kept (the prompt box still holds the whole text), said under the prompt.
let cut = null; // { n, chars, total, prompt }
function showCut(next = cut) {
  cut = next || null;
  const note = $("#cut-note");
  note.textContent = cut ? t("x.truncated", { n: cut.n, chars: cut.chars.toLocaleString("en-US"), total: cut.total.toLocaleString("en-US") }) : "";
  note.hidden = !cut;
}

// A failed analyse leaves the previous run's panels on the page under the new prompt: they are
// faded and a note above them names the prompt they show, until a run loads.
let staleRun = null;
function markStale(run) {
  staleRun = run || null;
  const note = $("#stale-note");
  const shown = staleRun ? (staleRun.text.length > 120 ? `${staleRun.text.slice(0, 120)}…` : staleRun.text) : "";
  note.textContent = staleRun ? t("x.stale", { prompt: `“${shown}”` }) : "";
  note.hidden = !staleRun;
  for (const id of ["#tokens", "#explorer", "#tools"]) $(id).classList.toggle("stale-panels", Boolean(staleRun));
  document.body.dataset.stale = staleRun ? "1" : "0";
}

// Report a failed fetch to the person; an aborted one was replaced on purpose.
function report(err) {
  if (isAbort(err)) return;
  showError(err && err.message ? err.message : String(err));
}

// The newest request wins: starting one aborts the one before, and every await checks
// that its request is still the latest before it touches the page.
let current = null;
function begin(kind) {
  if (current) current.controller.abort();
  current = { kind, controller: new AbortController(), steps: 0 };
  busy(current);
  return current;
}
const latest = (req) => req === current;
function end(req) {
  if (!latest(req)) return;
  current = null;
  busy(null);
}

function busy(req) {
  const box = $("#busy");
  box.hidden = !req;
  box.textContent = !req ? "" : req.kind === "generate" ? t("x.gen.busy") : t("x.busy");
  document.body.dataset.busy = req ? req.kind : "";
  updateGenerate();
}

// Generate needs a decoder with an LM head, and no other run in flight: say why it cannot act.
function updateGenerate() {
  const picked = state.models.find((m) => m.name === $("#model-picker").value) || state.model;
  let why = "";
  if (picked && !picked.has_lm_head) why = t("x.gen.why_encoder", { model: picked.name });
  else if (current && current.kind === "analyse") why = t("x.gen.why_analysing");
  else if (current && current.kind === "generate") why = t("x.gen.why_generating");
  const button = $("#generate");
  button.disabled = Boolean(why);
  button.title = why || t("x.gen.title");
  $("#gen-count").disabled = Boolean(why) && !(current && current.kind === "generate");
  $("#gen-why").textContent = why;
  $("#gen-why").hidden = !why;
}

// ---- drawing --------------------------------------------------------------------------------

// Hand the page back to the browser between two pieces of long work, so that a click, a script
// call or a frame is answered in between; each piece is marked ("attnscope:<name>" when it
// starts) for the Performance panel, bench/browser.py and the tests.
async function pause(name) {
  await new Promise((resolve) => setTimeout(resolve, 0));
  performance.mark(`attnscope:${name}`);
}

function fillSelect(select, count, key, value) {
  select.replaceChildren(...Array.from({ length: count }, (_, i) => el("option", { value: String(i), text: t(key, { i }) })));
  select.value = String(value);
}

// The heatmap's legend: a decoder's causal mask (hatched), or an encoder's full attention (no hatching).
// The key rides on data-i18n, so that a language switch rewrites it.
function maskLegend(run) {
  const key = run.causal ? "x.legend.masked" : "x.legend.full";
  $("#legend-mask").dataset.i18n = key;
  $("#legend-mask").textContent = t(key);
  $("#legend-swatch").hidden = !run.causal;
}

function describeModel(m) {
  const kv = m.n_kv_heads !== m.n_heads ? t("x.model.kv", { kv: m.n_kv_heads }) : "";
  return t("x.model.summary", {
    name: m.name, arch: m.architecture, layers: m.n_layers, heads: m.n_heads, kv, d: m.d_model, dh: m.d_head, vocab: m.vocab_size,
    positions: t(`x.model.pos.${m.position_encoding}`), kind: t(m.causal ? "x.model.decoder" : "x.model.encoder"),
    params: (m.n_params / 1e6).toFixed(1),
  }) + t("x.model.placement_suffix", { dtype: m.dtype, device: m.device });
}

function cached(cache, key, load) {
  if (!cache.has(key)) cache.set(key, load().catch((err) => { cache.delete(key); throw err; }));
  return cache.get(key);
}

function headCaption(run, layer, head) {
  const score = run.heads.find((h) => h.layer === layer && h.head === head);
  $("#heat-title").textContent = t("x.heat.tokens", { n: shown() }); // a generation's step: the tokens it had
  $("#heat-caption").textContent = t("x.heat.title", { layer, head, entropy: scoreText(score.entropy, 2), prev: scoreText(score.prev_token, 2), first: scoreText(score.first_token, 2) }) +
    (score.induction === null && !pending(score) ? "" : t("x.heat.induction", { ind: inductionText(score, 2, run) })) +
    (extent === null ? "" : t("x.heat.scores_whole", { n: run.tokens.length })); // the scores are the whole run's
}

function wireHeatmap(div) {
  if (hoverWired) return;
  wireHover(div, $("#heat-tip"), (pt) => {
    if (!isLong(state.run)) return cellText(state, pt.y, pt.x);
    const bin = binOf(pt);
    return tiles.tile && bin ? binText(tiles.tile, state.run.tokens, bin[0], bin[1]) : "";
  });
  // A double-click zooms back out: plotly reports a click before it and one after it, which must not
  // move the selection (the first is undone, the second, detail 2, ignored)
  let beforeClick = null;
  div.on("plotly_doubleclick", () => {
    if (beforeClick && performance.now() - beforeClick.at < 1000) selectCell(beforeClick.pos, beforeClick.key);
    beforeClick = null;
  });
  div.on("plotly_click", (ev) => {
    const pt = ev.points.find((p) => p.data.type === "heatmap");
    if (!pt || (ev.event && ev.event.detail >= 2)) return;
    beforeClick = { pos: state.pos, key: state.key, at: performance.now() };
    if (!isLong(state.run)) return selectCell(pt.y, pt.x);
    const bin = binOf(pt), tile = tiles.tile;
    if (!bin || !tile) return;
    // a pooled bin selects its middle cell; the focus row then says where that query reads
    const mid = (edges, i) => Math.floor((edges[i] + edges[i + 1] - 1) / 2);
    selectCell(mid(tile.qEdges, bin[0]), mid(tile.kEdges, bin[1]));
  });
  div.on("plotly_relayout", (ev) => onRelayout(ev));
  div.addEventListener("wheel", () => { lastWheel = performance.now(); }, { passive: true, capture: true });
  hoverWired = true;
}

// ---- the tiled heatmap of a long run --------------------------------------------------------

// How many tokens the heatmap shows: the whole run, or fewer on a recorded generation's timeline.
let extent = null;
const shown = () => extent ?? state.run.tokens.length;

function tileView() {
  const { run, layer, head, zoom, pool, colour, pos, key } = state;
  return { run, layer, head, extent: shown(), zoom, pool, colour, cell: { q: pos, k: key },
           title: extent === null ? "" : t("x.step", { layer, head, k: Number($("#timeline").value) }) };
}

function tileDrawn(tile, ms) {
  const div = $("#heatmap");
  div.dataset.n = String(state.run.tokens.length);
  div.dataset.run = state.run.run_id;
  div.dataset.layer = String(state.layer);
  div.dataset.head = String(state.head);
  div.dataset.tileRows = String(tile.rows);
  div.dataset.tileCols = String(tile.cols);
  div.dataset.exact = tile.exact ? "1" : "0";
  div.dataset.tileMs = ms.toFixed(1); // asked -> drawn, read by bench/browser.py
  div.dataset.tiles = String(Number(div.dataset.tiles || 0) + 1);
  div.dataset.drawnAt = String(performance.now());
  $("#heat-pool").textContent = poolingText(tile);
  $("#heat-pool").hidden = false;
}

const tiles = new TileView($("#heatmap"), { onDrawn: tileDrawn, onError: report });

async function drawLongHead() {
  const { run, layer, head } = state;
  set({ slice: null, exact: null });
  const shown = tiles.show(tileView()); // asked for first: nothing else waits in front of it
  headCaption(run, layer, head);
  $("#pool-box").hidden = false;
  $("#layer-picker").value = String(layer);
  $("#head-picker").value = String(head);
  showZoomInputs();
  const tile = await shown;
  drawFocus(); // the selected row's top keys: after the overview, which the server computes first
  if (!tile) return;
  wireHeatmap($("#heatmap"));
  toURL();
}

async function drawHead() {
  const { run, layer, head } = state;
  if (isLong(run)) return drawLongHead();
  tiles.reset();
  $("#heat-pool").hidden = true;
  $("#pool-box").hidden = true;
  const key = `${run.run_id}:${layer}:${head}`;
  const slice = await cached(sliceCache, key, () => getAttentionBin(run.run_id, layer, head));
  const stale = () => state.run !== run || state.layer !== layer || state.head !== head; // a newer choice won
  if (stale()) return;
  await pause("heatmap"); // the slice's bytes were decoded in this task: the heatmap gets its own
  if (stale()) return;
  state.slice = slice;
  state.exact = null;
  cached(exactCache, key, () => getAttentionF32(run.run_id, layer, head)).then((exact) => {
    if (state.slice !== slice) return;
    state.exact = exact;
    readout();
  }).catch(report);
  if (extent !== null) { // another head drawn whole: the timeline goes back to its end
    extent = null;
    $("#timeline").value = $("#timeline").max;
    labelTimeline(Number($("#timeline").max));
  }
  headCaption(run, layer, head); // HTML, so that it wraps instead of running off a narrow chart
  const div = $("#heatmap");
  await drawHeatmap(div, slice, run.tokens, { colour: state.colour, zoom: state.zoom, cell: { q: state.pos, k: state.key } });
  div.dataset.n = String(slice.n);
  div.dataset.layer = String(layer);
  div.dataset.head = String(head);
  div.dataset.drawnAt = String(performance.now()); // read by bench/browser.py
  wireHeatmap(div);
  $("#layer-picker").value = String(layer);
  $("#head-picker").value = String(head);
  showZoomInputs();
  await pause("focus");
  if (state.slice !== slice) return;
  drawFocus();
  readout();
  toURL();
}

// The selected query's row: the 8-bit view of a short run's slice, or the exact row of a long
// run fetched on its own (the newest selection wins); long rows show their top keys.
let focusRequest = null;
async function drawFocus() {
  const { run, slice, pos, layer, head } = state;
  if (!run) return;
  const show = (row, exact) => {
    $("#focus-title").textContent = t("x.focus.title", { pos, token: showToken(run.tokens[pos].text), layer, head });
    drawFocusBars($("#focus-chart"), row, run.tokens, pos, { exact });
    drawFocusLines($("#focus-lines"), row, run.tokens, pos);
    const note = focusNote(row);
    $("#focus-note").textContent = note;
    $("#focus-note").hidden = !note;
  };
  if (!isLong(run)) {
    if (slice) show(rowOf(slice, pos), false);
    return;
  }
  if (focusRequest) focusRequest.abort();
  const controller = new AbortController();
  focusRequest = controller;
  try {
    const values = await getRow(run.run_id, layer, head, pos, 0, run.causal ? pos + 1 : run.tokens.length, { signal: controller.signal });
    if (controller !== focusRequest) return;
    state.row = { run, layer, head, pos, values };
    show(values, true);
    readout();
  } catch (err) {
    if (!isAbort(err) && controller === focusRequest) report(err);
  }
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
    $("#next-title").textContent = t("x.next.title", { pos, token: showToken(run.tokens[pos].text) });
    try {
      const next = await fetchNext(run.run_id, pos, temperature);
      if (state.run === run && state.pos === pos) drawNext($("#next-chart"), $("#next-actual"), next);
    } catch (err) {
      report(err);
    }
  }, delay);
}

// ---- selection: cell, token, head ---------------------------------------------------------

function readout() {
  if (!state.run) return;
  let text;
  if (!isLong(state.run)) {
    if (!state.slice) return;
    text = cellText(state, state.pos, state.key);
  } else {
    const { run, pos: q, key: k, row, layer, head } = state;
    text = t("heat.tip.cell", { q, qt: showToken(run.tokens[q].text), k, kt: showToken(run.tokens[k].text) });
    if (run.causal && k > q) text += t("heat.tip.masked");
    else if (row && row.run === run && row.pos === q && row.layer === layer && row.head === head) text += t("heat.tip.exact", { w: Number(row.values[k]).toPrecision(4) });
    else text += t("x.tile.loading");
  }
  $("#cell-readout").textContent = text.replace(/\n/g, " · ");
}

function moveCell() {
  const div = $("#heatmap");
  if (!div.layout) return;
  const { pos: q, key: k } = state;
  window.Plotly.relayout(div, { shapes: [{ type: "rect", x0: k - 0.5, x1: k + 0.5, y0: q - 0.5, y1: q + 0.5, line: { color: "#d6336c", width: 2 }, layer: "above" }] });
}

function selectCell(pos, key = pos) {
  const before = state.pos;
  const visible = state.run.causal ? Math.min(key, pos) : key;
  set({ pos, key: Math.max(0, visible) });
  markSelected($("#tokens"), pos);
  moveCell();
  drawFocus();
  readout();
  drawNextSoon();
  toURL();
  if (pos !== before) tools.update("pos", state);
}

function selectPos(pos) {
  selectCell(pos, pos);
}

async function selectHead(layer, head) {
  set({ layer, head });
  grid.select(layer, head);
  try {
    await drawHead();
  } catch (err) {
    report(err);
  }
  tools.update("head", state);
}

const grid = new HeadGrid($("#head-grid"), (layer, head) => selectHead(layer, head), report);
const tools = new Tools($("#tools"), { selectHead, error: showError, prompt: () => $("#prompt").value });

// Arrow keys move the selected cell (the query with up/down, the key with left/right).
function heatmapKeys(ev) {
  if (!state.run) return;
  const n = state.run.tokens.length;
  const moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1], Home: [0, -n], End: [0, n] };
  if (!moves[ev.key]) return;
  ev.preventDefault();
  const [dq, dk] = moves[ev.key];
  const q = Math.max(0, Math.min(n - 1, state.pos + dq));
  let k = Math.max(0, Math.min(n - 1, state.key + dk));
  if (state.run.causal) k = Math.min(k, q);
  selectCell(q, k);
}

// ---- zoom -------------------------------------------------------------------------------------

function showZoomInputs() {
  const z = state.zoom;
  for (const [id, v] of [["#zoom-q0", z?.q0], ["#zoom-q1", z?.q1], ["#zoom-k0", z?.k0], ["#zoom-k1", z?.k1]]) $(id).value = v ?? "";
}

function relabel(zoom) {
  const n = state.run.tokens.length;
  const z = zoom || { q0: 0, q1: n - 1, k0: 0, k1: n - 1 };
  const budget = tickBudget($("#heatmap"));
  const x = ticks(state.run.tokens, z.k0, z.k1, budget), y = ticks(state.run.tokens, z.q0, z.q1, budget);
  return { "xaxis.tickvals": x.tickvals, "xaxis.ticktext": x.ticktext, "yaxis.tickvals": y.tickvals, "yaxis.ticktext": y.ticktext };
}

let relabelling = false;
// A drag-zoom (or double-click reset) in plotly: the inputs, the labels and the URL follow.
function onRelayout(ev) {
  if (relabelling || !state.run) return;
  const keys = Object.keys(ev || {});
  if (!keys.some((k) => k.startsWith("xaxis.range") || k.startsWith("yaxis.range") || k.endsWith("autorange"))) return;
  $("#zoom-note").hidden = true; // it spoke of the range boxes' last zoom, which this one replaces
  if (isLong(state.run)) { // a finer (or coarser) tile of what is now in view; a burst of wheel steps asks once
    const all = keys.some((k) => k.endsWith("autorange")); // double-click: back to the overview
    set({ zoom: all ? null : windowFrom($("#heatmap"), shown()) });
    showZoomInputs();
    toURL();
    return tiles.show(tileView(), performance.now() - lastWheel < 200 ? 40 : 0); // a drag asks at once
  }
  const n = state.run.tokens.length;
  const zoom = rangesFrom($("#heatmap"), n);
  set({ zoom });
  showZoomInputs();
  relabelling = true;
  Promise.resolve(window.Plotly.relayout($("#heatmap"), relabel(zoom))).finally(() => { relabelling = false; });
  toURL();
}

function zoom() {
  if (!state.run) return;
  const n = isLong(state.run) ? shown() : state.run.tokens.length;
  const notes = [];
  const get = (id, dflt) => {
    const v = $(id).value;
    if (v === "") return dflt;
    const x = Math.round(Number(v));
    if (!Number.isFinite(x)) { notes.push(t("x.zoom.note.nan", { v })); return dflt; }
    const c = Math.max(0, Math.min(n - 1, x));
    if (c !== x) notes.push(t("x.zoom.note.clamped", { v: x, c, last: n - 1 }));
    return c;
  };
  let [q0, q1, k0, k1] = [get("#zoom-q0", 0), get("#zoom-q1", n - 1), get("#zoom-k0", 0), get("#zoom-k1", n - 1)];
  if (q0 > q1) { [q0, q1] = [q1, q0]; notes.push(t("x.zoom.note.swapped", { what: t("x.zoom_queries_word"), a: q0, b: q1 })); }
  if (k0 > k1) { [k0, k1] = [k1, k0]; notes.push(t("x.zoom.note.swapped", { what: t("x.zoom_keys"), a: k0, b: k1 })); }
  const note = $("#zoom-note");
  note.textContent = sentences(notes);
  note.hidden = !notes.length;
  const z = q0 === 0 && k0 === 0 && q1 === n - 1 && k1 === n - 1 ? null : { q0, q1, k0, k1 };
  set({ zoom: z });
  if (isLong(state.run)) {
    showZoomInputs();
    toURL();
    return tiles.show(tileView());
  }
  relabelling = true;
  Promise.resolve(window.Plotly.relayout($("#heatmap"), {
    "xaxis.range": [k0 - 0.5, k1 + 0.5], "yaxis.range": [q1 + 0.5, q0 - 0.5], ...relabel(z),
  })).finally(() => { relabelling = false; });
  showZoomInputs();
  toURL();
}

// ---- analyse --------------------------------------------------------------------------------

// the chat form: offered when the chosen model's tokenizer has a chat template
function chatMode() {
  return !$("#chat-toggle").hidden && $("#chat-mode").checked;
}

function chatMessages(text) {
  const system = $("#system-prompt").value.trim();
  return [...(system ? [{ role: "system", content: system }] : []), { role: "user", content: text }];
}

function updateChatForm() {
  const m = state.models.find((x) => x.name === $("#model-picker").value);
  $("#chat-toggle").hidden = !(m && m.has_chat_template);
  $("#system-box").hidden = !chatMode();
}

// truncate: a text over the model's limit is analysed from its beginning (its first limit tokens)
async function analyse(initial = {}, { truncate = false } = {}) {
  const text = $("#prompt").value;
  const modelName = $("#model-picker").value || undefined;
  showError("");
  showCut(null);
  hideStatus();
  const req = begin("analyse");
  try {
    const body = chatMode()
      ? { messages: chatMessages(text), model: modelName, top_k: 10 }
      : { text, model: modelName, top_k: 10, ...(truncate ? { truncate: true } : {}) };
    const run = await postJSON("/api/runs", body, { signal: req.controller.signal });
    $("#heatmap").dataset.runAt = String(performance.now()); // the analyse response, parsed (bench/browser.py)
    if (!latest(req)) return;
    if (run.truncated) showCut({ n: run.truncated.tokens, chars: run.truncated.chars, total: run.truncated.total_chars, prompt: text, run });
    await loadRun(run, initial);
  } catch (err) {
    if (latest(req)) {
      const limit = chatMode() ? null : tokenLimitOf(err);
      // a long paste is not a dead end: the button analyses its first `limit` tokens
      if (limit) showError(err.message, { key: "x.truncate", vars: { n: limit }, run: () => analyse(initial, { truncate: true }) });
      else report(err);
      if (!isAbort(err) && state.run) markStale(state.run);
    }
  } finally {
    end(req);
  }
}

async function loadRun(run, initial = {}) {
  markStale(null);
  const model = state.models.find((m) => m.name === run.model);
  const clamp = (v, hi, dflt) => (Number.isInteger(v) && v >= 0 && v < hi ? v : dflt);
  const layer = clamp(initial.layer, run.n_layers, 0);
  const head = clamp(initial.head, run.n_heads, 0);
  const pos = clamp(initial.pos, run.tokens.length, run.tokens.length - 1);
  let key = clamp(initial.key, run.tokens.length, pos);
  if (run.causal) key = Math.min(key, pos);
  const n = run.tokens.length;
  const z = initial.zoom;
  const zoomOk = z && [z.q0, z.q1, z.k0, z.k1].every((v) => v >= 0 && v < n) && z.q0 <= z.q1 && z.k0 <= z.k1;
  set({ run, model, layer, head, pos, key, slice: null, exact: null, row: null, zoom: zoomOk ? z : null });
  extent = null;
  tiles.reset();
  $("#zoom-note").hidden = true; // a note about the last run's zoom boxes
  showExportProblem(null); // about the last run's export
  grid.widen(run); // the columns' widths before anything is drawn in them
  $("#explorer").hidden = false;
  // a long run's overview tile is asked for before the token strip and pickers are built, and
  // drawn as soon as it arrives
  const drawing = isLong(run) ? drawHead() : null;
  renderTokens($("#tokens"), run, selectPos);
  markSelected($("#tokens"), pos);
  fillSelect($("#layer-picker"), run.n_layers, "common.layer", layer);
  fillSelect($("#head-picker"), run.n_heads, "common.head", head);
  maskLegend(run);
  $("#model-summary").textContent = describeModel(model);
  $("#model-summary").title = describeModel(model);
  $("#timeline-box").hidden = true;
  updateGenerate();
  await (drawing ?? drawHead());
  await pause("grid");
  if (state.run !== run) return;
  grid.render(run, state.sort, { layer, head }, model);
  loadScores(run); // the head scores computed after the analyse answered: filled in when they arrive
  await pause("next");
  if (state.run !== run) return;
  drawNextSoon();
  if (run.tokens.length <= SPARSITY_AUTO_MAX) loadSparsity(run);
  tools.update("run", state);
  if (initial.steps) {
    const tl = $("#timeline");
    tl.max = String(initial.steps);
    tl.value = String(initial.steps);
    labelTimeline(initial.steps);
    $("#timeline-box").hidden = false; // shown once the full run is drawn
  }
}

// Sparsity (top-1 / top-5 mass, keys for 90 %) reads every cell of every head again: on a
// long run (16k tokens: about a minute of CPU) it is asked for only when a sort needs it, so
// that it never competes with the overview and the zoom tiles.
const SPARSITY_AUTO_MAX = 2048;
const SPARSITY_SORTS = new Set(["top1", "keys_90"]);
const sparsityAsked = new WeakMap(); // run -> the one request for its sparsity

function loadSparsity(run) {
  if (!sparsityAsked.has(run)) {
    sparsityAsked.set(run, (async () => {
      try {
        const { heads } = await getJSON(`/api/runs/${encodeURIComponent(run.run_id)}/sparsity`);
        heads.forEach((s, i) => Object.assign(run.heads[i], s));
        if (state.run === run) grid.annotate(run);
      } catch (err) {
        sparsityAsked.delete(run); // a later sort may ask again
        report(err);
      }
    })());
  }
  return sparsityAsked.get(run);
}

// A fused layer's head scores (entropy and max need every cell of every head once more; previous-token,
// first-token and induction a few dot products a row): the server computes them after the analyse has
// answered (the run lists them in scores_pending, null until then). The page draws at once, says
// "computing…" where they belong, and fills them in (badges too; re-sorting a grid sorted by them)
// when a waiting request for the run's heads returns them.
const LATE_SORTS = new Set(["entropy", "max", "prev_token", "first_token", "induction"]);
// the page's one wait for late scores: a new run's wait cancels the last run's, so that stale waits never
// hold the browser's few connections to the server while tiles are asked for
let scoresWait = null; // { run, controller }
const scoresAsked = new WeakMap(); // run -> the one wait for its late scores

function scoresNote(run) {
  const note = $("#scores-status");
  note.textContent = t("x.scores.busy", { n: run.tokens.length });
  note.hidden = !(run.scores_pending || []).length;
}

function loadScores(run) {
  scoresNote(run);
  if (scoresWait && scoresWait.run !== run) {
    scoresWait.controller.abort();
    scoresAsked.delete(scoresWait.run); // coming back to that run asks again
    scoresWait = null;
  }
  if (!(run.scores_pending || []).length) return Promise.resolve();
  if (!scoresAsked.has(run)) {
    const controller = new AbortController();
    scoresWait = { run, controller };
    scoresAsked.set(run, (async () => {
      try {
        const done = await waitHeads(run.run_id, { signal: controller.signal });
        if (done.error) throw new Error(done.error);
        done.heads.forEach((s, i) => Object.assign(run.heads[i], s));
        run.scores_pending = done.scores_pending;
        if (state.run !== run) return;
        if (LATE_SORTS.has(state.sort)) grid.render(run, state.sort, state, state.model);
        else grid.annotate(run);
        headCaption(run, state.layer, state.head);
      } catch (err) {
        scoresAsked.delete(run); // a later load of this run asks again
        if (state.run === run && !isAbort(err)) report(err);
      } finally {
        if (scoresWait && scoresWait.run === run) scoresWait = null;
        if (state.run === run) scoresNote(run);
      }
    })());
  }
  return scoresAsked.get(run);
}

// ---- generate -------------------------------------------------------------------------------

// The generation's last word, kept as a catalogue key and its values so that a language
// switch rewrites it.
let lastStatus = null;
function hideStatus() {
  lastStatus = null;
  $("#gen-status").hidden = true;
  $("#gen-continue").hidden = true;
}

function showStatus(key, vars = {}, offerContinue = false) {
  lastStatus = { key, vars, offerContinue };
  $("#gen-status span").textContent = t(key, vars);
  $("#gen-status").hidden = false;
  $("#gen-continue").hidden = !offerContinue;
}

// ms between two redraws of the live view at least: ten a second look continuous, and the CPU
// is left to the stream (bench/browser.py: the browser's share of it slows the server's steps)
const LIVE_GAP = 100;
let lastGeneration = null; // the request body, so that "continue past end-of-text" can repeat it

// Generate with the KV cache, recording every step: the heatmap fills row by row as tokens
// stream in — redrawn at most once per animation frame (and ten times a second), painting only
// the new rows, so the page keeps up with the stream and stays responsive — then the recording
// becomes an ordinary run with a timeline, drawn in pieces (pause) with the page answering
// between them.
async function generateAndRecord({ stopAtEos = true, text = null } = {}) {
  const asked = genCount(); // 0, -3 or nothing: said under the box, and nothing starts
  if (asked === null) {
    $("#gen-count").focus();
    return;
  }
  if (text !== null) $("#prompt").value = text;
  // a run cut from the prompt box's text (a long paste) goes on from the beginning it analysed
  const cutOf = (run) => cut && cut.run === run && cut.prompt === $("#prompt").value;
  if (!state.run || (state.run.text !== $("#prompt").value && !cutOf(state.run)) || state.run.model !== $("#model-picker").value) await analyse();
  if (!state.run || !state.model.has_lm_head || current) return;
  const prompt = cutOf(state.run) ? state.run.text : $("#prompt").value;
  const body = { text: prompt, model: state.run.model, max_new_tokens: asked, temperature: Number($("#gen-temp").value),
                 top_k: 0, top_p: 1, seed: 0, stop_at_eos: stopAtEos, record: true, watch_layer: state.layer, watch_head: state.head };
  lastGeneration = body;
  const { layer, head } = state;
  showError("");
  showCut(null); // the prompt box will hold the generated text
  hideStatus();
  const req = begin("generate");
  const rows = [];
  const tokens = state.run.tokens.slice();
  const div = $("#heatmap");
  let frame = 0, timer = 0, lastDraw = -Infinity, draws = 0, painted = 0, steps = 0, serverMs = 0, done = null, runId = null;
  const liveBox = $("#live");
  // sized once for the whole generation; each redraw paints only the rows that arrived since
  const live = new LiveHeatmap($("#live-canvas"), tokens.length + asked, state.colour);
  const draw = () => {
    frame = 0;
    lastDraw = performance.now();
    if (!latest(req) || !rows.length) return;
    liveBox.hidden = false;
    div.classList.add("under-live"); // the previous run's heatmap would show round the overlay
    painted += live.draw(rows);
    $("#live-caption").textContent = t("x.recording", { layer, head, rows: rows.length, steps });
    draws += 1;
    div.dataset.liveRows = String(rows.length);
    div.dataset.liveDraws = String(draws);
    div.dataset.livePainted = String(painted); // rows painted, over all redraws: each row once
    $("#busy").textContent = t("x.gen.progress", { steps, asked });
  };
  // one redraw per animation frame at most, and none sooner than LIVE_GAP ms after the last:
  // the tokens that arrive meanwhile share the next one
  const schedule = () => {
    if (frame || timer) return;
    const wait = lastDraw + LIVE_GAP - performance.now();
    if (wait <= 0) frame = requestAnimationFrame(draw);
    else timer = setTimeout(() => { timer = 0; frame = requestAnimationFrame(draw); }, wait);
  };
  try {
    const r = await postStream("/api/generate", body, { signal: req.controller.signal });
    for await (const ev of readSSE(r)) {
      if (!latest(req)) return;
      if (ev.data.rows) rows.push(...ev.data.rows);
      if (ev.event === "token") {
        steps += 1;
        req.steps = steps;
        tokens.push({ index: tokens.length, id: ev.data.id, text: ev.data.token, start: 0, end: 0, special: ev.data.special, partial: ev.data.partial });
        div.dataset.liveTokens = String(steps);
        serverMs += ev.data.ms;
        div.dataset.liveServerMs = serverMs.toFixed(1); // the server's own time for the steps (bench/browser.py)
      }
      if (ev.event === "run") runId = ev.data.run_id;
      if (ev.event === "done") done = ev.data;
      schedule();
    }
    cancelAnimationFrame(frame);
    clearTimeout(timer);
    if (!latest(req)) return;
    draw(); // the last rows, before the full heatmap replaces the live view
    const run = await getJSON(`/api/runs/${encodeURIComponent(runId)}`, { signal: req.controller.signal });
    if (!latest(req)) return;
    $("#prompt").value = run.text; // prompt + generated text; an end-of-text token adds none (the strip marks it)
    await loadRun(run, { layer, head, pos: run.tokens.length - 1, steps });
    div.dataset.liveDraws = String(draws);
    if (done && done.stop === "eos") {
      showStatus("x.gen.eos", { n: done.n_new, asked }, true);
    } else if (done) {
      showStatus(stopAtEos ? "x.gen.length" : "x.gen.length_no_eos", { n: done.n_new });
    }
    $("#gen-status").dataset.stop = done ? done.stop : "";
  } catch (err) {
    if (isAbort(err) || !latest(req)) {
      showStatus("x.gen.replaced", { n: steps });
      $("#gen-status").dataset.stop = "client";
    } else {
      report(err);
      showStatus("x.gen.failed", { message: errorText(err && err.message ? err.message : String(err)) }); // by the button too
    }
  } finally {
    cancelAnimationFrame(frame);
    clearTimeout(timer);
    if (latest(req) || !current || current.kind !== "generate") {
      liveBox.hidden = true;
      div.classList.remove("under-live");
    }
    end(req);
  }
}

// Generate's count: a whole number from 1 to the box's max, or null and a note under the box
// that says what is wrong (kept as a key, so that a language switch rewrites it).
let countProblem = null;
function genCount() {
  const box = $("#gen-count");
  const max = Number(box.max) || 512;
  const raw = box.value.trim();
  const n = Number(raw);
  if (raw === "" || box.validity.badInput) countProblem = { key: "x.gen.count_empty", vars: { max } };
  else countProblem = Number.isInteger(n) && n >= 1 && n <= max ? null : { key: "x.gen.count_bad", vars: { v: raw, max } };
  showCountProblem();
  if (countProblem) hideStatus(); // the last generation's word would read as this request's answer
  return countProblem ? null : n;
}

function showCountProblem() {
  const note = $("#gen-count-error");
  note.textContent = countProblem ? t(countProblem.key, countProblem.vars) : "";
  note.hidden = !countProblem;
  $("#gen-count").setAttribute("aria-invalid", countProblem ? "true" : "false");
}

// The timeline's label at step k of its max: "after k of N generated tokens", or all of them.
function labelTimeline(k) {
  const total = Number($("#timeline").max);
  $("#timeline-value").textContent = k === total ? t("x.timeline.all", { n: total }) : t("x.timeline.step", { k, n: total });
}

// Step k of a recorded generation: the heatmap as it stood then, and the newest token of that
// step focused, so that the focus row, the readout and the next-token chart (what the model
// predicted there, and the token it went on to write) move with the timeline too.
async function showStep(k) {
  const { run } = state;
  const total = Number($("#timeline").max);
  const n = run.tokens.length - (total - k);
  labelTimeline(k);
  const before = state.pos;
  if (before !== n - 1) set({ pos: n - 1, key: n - 1 }); // drawn with the step's heatmap below
  extent = k === total ? null : n; // the rows and keys that existed after step k
  if (isLong(run)) await tiles.show(tileView(), 30);
  else {
    const { slice } = state;
    const data = slice.data.subarray(0, (n * (n + 1)) / 2);
    await drawHeatmap($("#heatmap"), { ...slice, n, data }, run.tokens.slice(0, n), { colour: state.colour, title: t("x.step", { layer: state.layer, head: state.head, k }) });
  }
  headCaption(run, state.layer, state.head); // the step's heading, in the page's language
  if (state.run !== run) return;
  selectCell(n - 1);
  if (before !== n - 1) tools.update("pos", state); // selectCell saw the position already set
}

// ---- start ----------------------------------------------------------------------------------

// The heatmap as an image that says what it shows (model, head, tokens; a recorded step's
// caption under it) and without the page's selection box.
async function exportHeatmap(format) {
  const div = $("#heatmap");
  if (!state.run || !div.layout) return;
  const name = plotlyText(t("x.export.title", { model: state.run.model, layer: state.layer, head: state.head, n: shown() }));
  const caption = div.layout.title?.text || "";
  const layout = { ...div.layout, shapes: [], title: { ...div.layout.title, text: caption ? `${name}<br>${caption}` : name },
                   margin: { ...div.layout.margin, b: (div.layout.margin?.b ?? 28) + 22 } };
  const url = await window.Plotly.toImage({ data: div.data, layout },
    { format, width: div.clientWidth, height: div.clientHeight + 22, scale: format === "png" ? 2 : 1 });
  save(`attnscope-L${state.layer}H${state.head}.${format}`, url);
}

// Hand `url` (a data: or blob: URL) to the browser as a download called `name`.
function save(name, url) {
  const a = el("a", { href: url, download: name });
  document.body.append(a);
  a.click();
  a.remove();
}

function download(name, blob) {
  const url = URL.createObjectURL(blob);
  save(name, url);
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

// Run a handler and show what goes wrong instead of dropping it.
const safely = (fn) => (...args) => Promise.resolve().then(() => fn(...args)).catch(report);

// An export's refusal or failure is said under the export buttons, where it was asked for (kept as
// a key or the server's words, so that a language switch rewrites it); the next export that
// succeeds, or another run, clears it.
let exportProblem = null;
function showExportProblem(problem = exportProblem) {
  exportProblem = problem || null;
  const box = $("#export-error");
  box.textContent = !exportProblem ? "" : exportProblem.key ? t(exportProblem.key, exportProblem.vars) : errorText(exportProblem.message);
  box.hidden = !exportProblem;
}
const exporting = (fn) => (...args) => Promise.resolve().then(() => fn(...args)).then(
  () => showExportProblem(null),
  (err) => showExportProblem({ key: err?.key, vars: err?.vars, message: err?.message ?? String(err) }));

// the model a shared link asked for when this server does not serve it (null: none, or resolved)
let unknownModel = null;
function showModelNote() {
  const note = $("#model-note");
  note.textContent = unknownModel ? t("x.model.unknown", { wanted: unknownModel, model: $("#model-picker").value }) : "";
  note.hidden = !unknownModel;
}

// Redraw every translated piece of the explorer in the current language, from what is loaded.
async function repaint(fillModels) {
  fillModels();
  showModelNote();
  showError(lastError, lastOffer);
  showCut();
  markStale(staleRun);
  busy(current);
  if (lastStatus) showStatus(lastStatus.key, lastStatus.vars, lastStatus.offerContinue);
  showCountProblem();
  showExportProblem();
  tools.labels();
  if (!state.run) return;
  fillSelect($("#layer-picker"), state.run.n_layers, "common.layer", state.layer);
  fillSelect($("#head-picker"), state.run.n_heads, "common.head", state.head);
  $("#model-summary").textContent = describeModel(state.model);
  $("#model-summary").title = describeModel(state.model);
  renderTokens($("#tokens"), state.run, selectPos);
  markSelected($("#tokens"), state.pos);
  grid.render(state.run, $("#grid-sort").value, state, state.model);
  grid.annotate(state.run);
  scoresNote(state.run);
  drawNextSoon();
  if (!$("#timeline-box").hidden) await showStep(Number($("#timeline").value));
  else await drawHead();
  tools.draw();
}

async function init() {
  const [{ models }] = await Promise.all([getJSON("/api/models"), initLanguage()]);
  set({ models });
  tools.labels(); // built before the language was chosen
  const picker = $("#model-picker");
  const fillModels = () => {
    const keep = picker.value;
    picker.replaceChildren(...models.map((m) => el("option", { value: m.name, text: t("x.model.option", { name: m.name, family: m.causal ? m.family : t("x.model.encoder_family", { family: m.family }), dtype: m.dtype, device: m.device }) })));
    if (keep) picker.value = keep;
  };
  fillModels();
  const dflt = models.find((m) => m.default);
  if (dflt) picker.value = dflt.name;
  urlExtras.push(() => ({ lang: lang() })); // the shareable URL keeps the language
  onLanguage(() => repaint(fillModels)); // every word of the explorer, without a reload

  $("#analyze").addEventListener("click", () => analyse());
  $("#prompt").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) analyse();
  });
  for (const b of document.querySelectorAll(".example")) {
    b.addEventListener("click", () => { $("#prompt").value = b.dataset.example; analyse(); });
  }
  picker.addEventListener("change", updateGenerate);
  picker.addEventListener("change", updateChatForm);
  $("#chat-mode").addEventListener("change", updateChatForm);
  updateChatForm();
  $("#layer-picker").addEventListener("change", (ev) => selectHead(Number(ev.target.value), state.head));
  $("#head-picker").addEventListener("change", (ev) => selectHead(state.layer, Number(ev.target.value)));
  $("#colour-scale").addEventListener("change", safely((ev) => { set({ colour: ev.target.value }); return state.run && drawHead(); }));
  $("#grid-sort").addEventListener("change", safely(async (ev) => {
    set({ sort: ev.target.value });
    const run = state.run;
    if (run && SPARSITY_SORTS.has(state.sort) && run.heads[0]?.top1 === undefined) {
      const note = $("#sparsity-status");
      note.textContent = t("x.sparsity.busy", { n: run.tokens.length });
      note.hidden = false;
      try { await loadSparsity(run); } finally { note.hidden = true; }
      if (state.run !== run) return;
    }
    if (state.run) grid.render(state.run, state.sort, state, state.model);
    toURL();
  }));
  $("#temperature").addEventListener("input", (ev) => {
    const t = Number(ev.target.value);
    $("#temperature-value").textContent = t.toFixed(2);
    set({ temperature: t });
    drawNextSoon(60);
    toURL();
  });
  $("#export-png").addEventListener("click", exporting(() => exportHeatmap("png")));
  $("#export-svg").addEventListener("click", exporting(() => exportHeatmap("svg")));
  $("#grid-png").addEventListener("click", safely(() => grid.exportImage("png").then((blob) => download("attnscope-heads.png", blob))));
  $("#grid-svg").addEventListener("click", safely(() => grid.exportImage("svg").then((blob) => download("attnscope-heads.svg", blob))));
  $("#generate").addEventListener("click", () => generateAndRecord());
  $("#gen-count").addEventListener("input", () => { if (countProblem) genCount(); }); // a fixed count clears the note
  $("#gen-continue").addEventListener("click", () => lastGeneration && generateAndRecord({ stopAtEos: false, text: lastGeneration.text }));
  $("#timeline").addEventListener("input", safely((ev) => showStep(Number(ev.target.value))));
  $("#zoom-apply").addEventListener("click", safely(zoom));
  for (const id of ["#zoom-q0", "#zoom-q1", "#zoom-k0", "#zoom-k1"]) {
    $(id).addEventListener("keydown", (ev) => { if (ev.key === "Enter") safely(zoom)(); });
  }
  $("#pool").addEventListener("change", safely((ev) => {
    set({ pool: ev.target.value });
    toURL();
    return state.run && isLong(state.run) && tiles.show(tileView());
  }));
  $("#zoom-reset").addEventListener("click", safely(() => {
    set({ zoom: null });
    $("#zoom-note").hidden = true;
    return state.run && drawHead();
  }));
  $("#heatmap").addEventListener("keydown", heatmapKeys);
  $("#export-json").addEventListener("click", exporting(async () => {
    if (!state.run) return;
    let blob;
    try {
      blob = await getBlob(`/api/runs/${encodeURIComponent(state.run.run_id)}/export`);
    } catch (err) { // a long run's JSON (every head's n x n cells) is refused: say so, and what to press instead
      const m = err.status === 422 && String(err.message).match(/would hold ([\d,]+) attention cells, more than this server's limit of ([\d,]+)/);
      if (!m) throw err;
      throw Object.assign(new Error(err.message), { key: "x.export.json_refused", vars: { cells: m[1], limit: m[2] } });
    }
    download(`attnscope-run-${state.run.run_id}.json`, blob);
  }));
  // what the run keeps (O(n·d)), from which any head is rebuilt exactly: the export of a run of any length
  $("#export-kept").addEventListener("click", exporting(async () => {
    if (!state.run) return;
    const blob = await getBlob(`/api/runs/${encodeURIComponent(state.run.run_id)}/export?format=safetensors`);
    download(`attnscope-run-${state.run.run_id}.safetensors`, blob);
  }));
  window.addEventListener("unhandledrejection", (ev) => { report(ev.reason); ev.preventDefault(); });
  updateGenerate();

  // a shared link reopens the same view; a first visit analyses the prefilled example at once
  const want = fromURL();
  if (want.model && models.some((m) => m.name === want.model)) picker.value = want.model;
  else if (want.model) { // a link to a model this server lacks: say so, rather than quietly show another
    unknownModel = want.model;
    showModelNote();
    picker.addEventListener("change", () => { unknownModel = null; showModelNote(); }, { once: true });
  }
  if (want.sort && [...$("#grid-sort").options].some((o) => o.value === want.sort)) set({ sort: want.sort });
  if (want.colour && [...$("#colour-scale").options].some((o) => o.value === want.colour)) set({ colour: want.colour });
  if (want.pool === "mean") set({ pool: "mean" });
  $("#pool").value = state.pool;
  if (want.temperature !== undefined && want.temperature >= 0.1 && want.temperature <= 3) set({ temperature: want.temperature });
  $("#grid-sort").value = state.sort;
  $("#colour-scale").value = state.colour;
  $("#temperature").value = String(state.temperature);
  $("#temperature-value").textContent = state.temperature.toFixed(2);
  $("#prompt").value = want.text || $("#prompt").value || DEFAULT_PROMPT; // keep what was typed while the page loaded
  updateGenerate();
  await analyse(want);
}

function start() {
  init().catch((err) => showError(t("x.start_failed", { message: errorText(err.message) })));
}
// plotly.min.js is a deferred classic script; modules run after it
if (window.Plotly) start();
else window.addEventListener("load", start);
