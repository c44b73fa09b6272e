// Analyse a prompt once and load the run into every panel; then the head scores the server
// computes after answering (late scores), and the sparsity scores a sort asks for.
import { $, el, isAbort } from "../dom.js";
import { getJSON, postJSON, waitHeads } from "../api.js";
import { state, set, toURL, ui } from "../state.js";
import { markSelected, renderTokens } from "../views/tokens.js";
import { t } from "../i18n.js";
import { markStale, report, showCut, showError, tokenLimitOf } from "./errors.js";
import { begin, end, latest } from "./requests.js";
import { drawHead, drawNextSoon, headCaption, labelTimeline, pause } from "./draw.js";
import { grid, selectPos, tools } from "./selection.js";
import { isLong, tiles } from "./zoom.js";
import { hideStatus, showStep, updateGenerate } from "./timeline.js";
import { showExportProblem } from "./export.js";

// the event a new run sends, before it is drawn (runfiles.js listens: no import back into this module)
export const NEW_RUN = "attnscope:new-run";

// ---- the prompt ------------------------------------------------------------------------------

// the chat form: offered when the chosen model's tokenizer has a chat template
function chatMode() {
  return !$("#chat-toggle").hidden && $("#chat-mode").checked;
}

function chatMessages(text) {
  const system = $("#system-prompt").value.trim();
  return [...(system ? [{ role: "system", content: system }] : []), { role: "user", content: text }];
}

export function updateChatForm() {
  const m = state.models.find((x) => x.name === $("#model-picker").value);
  $("#chat-toggle").hidden = !(m && m.has_chat_template);
  $("#system-box").hidden = !chatMode();
}

// truncate: a text over the model's limit is analysed from its beginning (its first limit tokens)
export async function analyse(initial = {}, { truncate = false } = {}) {
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
      if (limit) showError(err, { key: "x.truncate", vars: { n: limit }, run: () => analyse(initial, { truncate: true }) });
      else report(err);
      if (!isAbort(err) && state.run) markStale(state.run);
    }
  } finally {
    end(req);
  }
}

// ---- the run's panels -------------------------------------------------------------------------

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

// a run opened from a file may come from a model this server has not loaded (m undefined): its
// attention is shown from what the run keeps
function describeModel(m, run = state.run) {
  if (!m) return t("x.model.not_loaded", { name: run.model });
  const kv = m.n_kv_heads !== m.n_heads ? t("x.model.kv", { kv: m.n_kv_heads }) : "";
  return t("x.model.summary", {
    name: m.name, arch: m.architecture, layers: m.n_layers, heads: m.n_heads, kv, d: m.d_model, dh: m.d_head, vocab: m.vocab_size,
    positions: t(`x.model.pos.${m.position_encoding}`), kind: t(m.causal ? "x.model.decoder" : "x.model.encoder"),
    params: (m.n_params / 1e6).toFixed(1),
  }) + t("x.model.placement_suffix", { dtype: m.dtype, device: m.device });
}

export async function loadRun(run, initial = {}) {
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
  state.extent = null;
  tiles.reset();
  $("#zoom-note").hidden = true; // a note about the last run's zoom boxes
  showExportProblem(null); // about the last run's export
  // what was about the last run (its HTML file offer, the note that a file was opened) goes: runfiles.js listens
  document.dispatchEvent(new CustomEvent(NEW_RUN));
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
  $("#model-summary").textContent = describeModel(model, run);
  $("#model-summary").title = describeModel(model, run);
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
  $("#why-here").hidden = !run.causal; // QK attribution needs a decoder
  tools.update("run", state);
  if (initial.steps) {
    const tl = $("#timeline");
    tl.max = String(initial.steps);
    tl.value = String(initial.steps);
    labelTimeline(initial.steps);
    $("#timeline-box").hidden = false; // shown once the full run is drawn
  }
}

// The loaded run's panels in the current language.
export async function repaintRun() {
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

// ---- sparsity -----------------------------------------------------------------------------------

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

// The head grid sorted by `sort`: a sparsity sort of a run without those scores asks for them first.
export async function sortGrid(sort) {
  set({ sort });
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
}

// ---- late scores --------------------------------------------------------------------------------

// A fused layer's head scores (entropy and max need every cell of every head once more; previous-token,
// first-token and induction a few dot products a row): the server computes them after the analyse has
// answered (the run lists them in scores_pending, null until then). The page draws at once, says
// "computing…" where they belong, and fills them in (badges too; re-sorting a grid sorted by them)
// when a waiting request for the run's heads returns them.
const LATE_SORTS = new Set(["entropy", "max", "prev_token", "first_token", "induction"]);
// the page's one wait for late scores: a new run's wait cancels the last run's, so that stale waits never
// hold the browser's few connections to the server while tiles are asked for
const scoresAsked = new WeakMap(); // run -> the one wait for its late scores

function scoresNote(run) {
  const note = $("#scores-status");
  note.textContent = t("x.scores.busy", { n: run.tokens.length });
  note.hidden = !(run.scores_pending || []).length;
}

function loadScores(run) {
  scoresNote(run);
  if (ui.scoresWait && ui.scoresWait.run !== run) {
    ui.scoresWait.controller.abort();
    scoresAsked.delete(ui.scoresWait.run); // coming back to that run asks again
    ui.scoresWait = null;
  }
  if (!(run.scores_pending || []).length) return Promise.resolve();
  if (!scoresAsked.has(run)) {
    const controller = new AbortController();
    ui.scoresWait = { run, controller };
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
        if (ui.scoresWait && ui.scoresWait.run === run) ui.scoresWait = null;
        if (state.run === run) scoresNote(run);
      }
    })());
  }
  return scoresAsked.get(run);
}
