// The explorer's state in one object. `set` changes it; the controller (main.js and explorer/)
// redraws the views a change affects, and toURL / fromURL mirror it in the address bar.
import { search, setSearch } from "./page.js";

/**
 * The API's answers the views draw, as the routes declare them (the engine's result types; /openapi.json
 * names each). tests/web/test_i18n.py checks these fields against the Python declarations.
 * @typedef {{index: number, id: number, text: string, start: number, end: number, special: boolean,
 *   partial: boolean}} Token
 * @typedef {{id: number, token: string, prob: number}} TokenProb
 * @typedef {{id: number, token: string, prob: number, rank: number}} ActualNext
 * @typedef {{position: number, top: TokenProb[], actual_next: ?ActualNext}} PositionPrediction
 * @typedef {{layer: number, head: number, entropy: ?number, prev_token: ?number, first_token: ?number,
 *   max: ?number, induction: ?number}} HeadScore
 * @typedef {{tokens: number, chars: number, total_chars: number}} Truncated
 * @typedef {{run_id: string, model: string, causal: boolean, n_layers: number, n_heads: number, text: string,
 *   tokens: Token[], predictions: PositionPrediction[], heads: HeadScore[], induction_queries: number,
 *   induction_min_queries: number, timing_ms: Object<string, number>, scores_pending: string[],
 *   stored: boolean, truncated: ?Truncated}} RunBody
 * @typedef {{q0: number, q1: number, k0: number, k1: number}} Zoom
 */

/** @type {{models: Object[], model: ?Object, run: ?RunBody, layer: number, head: number, pos: number,
 *   key: number, temperature: number, colour: string, sort: string, zoom: ?Zoom, slice: ?Object,
 *   row: ?{run: RunBody, layer: number, head: number, pos: number, values: Float32Array}, pool: string,
 *   extent: ?number}} */
export const state = {
  models: [],
  model: null, // the ModelOut of the current run's model
  run: null, // the run (RunBody) of POST /api/runs
  layer: 0,
  head: 0,
  pos: 0, // selected query position
  key: 0, // selected key position (keyboard cell cursor)
  temperature: 1,
  colour: "linear",
  sort: "position", // head-grid order
  zoom: null, // {q0, q1, k0, k1}: the visible query and key ranges, or null for all
  slice: null, // binary attention of the selected head (a short run)
  row: null, // a long run's exact row at the selected query: {run, layer, head, pos, values}
  pool: "max", // how a long run's tiles pool the cells of a bin: "max" or "mean"
  extent: null, // tokens the heatmap shows: null for the whole run, fewer on a recorded generation's timeline
};

// What the explorer's modules keep between events besides what a person set (`state`): the requests
// in flight, the notes and errors shown (a language switch says them again), timers. Each field
// belongs to the module named beside it, which alone writes it; all of the page's state is in this file.
export const ui = {
  scoresWait: null, // explorer/analyse.js: the head scores being waited for, { run, controller }, or null
  wireHeatmap: () => {}, // explorer/draw.js: what a drawn heatmap answers (selection.js's wireHeatmap, given once by the controller)
  focusRequest: null, // explorer/draw.js: the AbortController of the long row being fetched
  nextTimer: null, // explorer/draw.js: the next-token chart's pending redraw (a timeout id)
  error: "", // explorer/errors.js: the error box's error (what was thrown, or the page's own words); "" for none
  errorOffer: null, // explorer/errors.js: its way forward, a button: {key, vars, run}, or null
  cut: null, // explorer/errors.js: the truncated prompt's note, { n, chars, total, prompt, run }, or null
  staleRun: null, // explorer/errors.js: the run a failed analyse's stale panels show, or null
  exportProblem: null, // explorer/export.js: why an export failed, {key, vars, error}, or null
  lastGeneration: null, // explorer/generate.js: the last generation's request body ("continue past end-of-text" repeats it)
  offeredModels: [], // explorer/offered.js: models offered but not loaded, [{ name, about }] (GET /api/models: available)
  request: null, // explorer/requests.js: the request in flight, {kind, controller, steps}, or null
  htmlOffer: null, // explorer/runfiles.js: what the HTML file would hold, {run, heads, size}, or null
  opened: null, // explorer/runfiles.js: the "opened a run file" note's run, until the next run
  hoverWired: false, // explorer/selection.js: the heatmap's hover handlers are attached
  generationStatus: null, // explorer/timeline.js: the generation's last word, {key, vars, offerContinue}, or null
  countProblem: null, // explorer/timeline.js: the token-count note, {key, vars}, or null
  lastWheel: -Infinity, // explorer/zoom.js: when the last wheel zoom came (a burst's tile waits for it to settle)
  relabelling: false, // explorer/zoom.js: our own relayout (new tick labels) is under way, not a zoom of the person's
  survey: null, // tools/survey.js: the corpus survey shown, {id, status, survey, ...} (GET /api/surveys/{id}), or null
  surveyPoll: null, // tools/survey.js: the running survey's poll timer, or null
  surveyOnGrid: false, // tools/survey.js: the head map's badges and labels come from the survey, not the prompt
};

export function set(patch) {
  Object.assign(state, patch);
}

// more URL parameters, from views that own some (the causal tools: view=..., their inputs)
export const urlExtras = [];

// The view's state as a shareable URL: everything a person set, so a link reopens the same view.
// A prompt longer than this goes into the shareable URL as its run's id (run=…: the server keeps the run,
// in its run directory across restarts), not as its text: a 6,500-character link is no link to share.
export const LINK_TEXT_MAX = 1000;

export function toURL() {
  if (!state.run) return;
  const text = document.getElementById("prompt").value;
  const byId = text.length > LINK_TEXT_MAX && state.run.run_id && state.run.text === text;
  const params = new URLSearchParams({
    ...(byId ? { run: state.run.run_id } : { text }),
    model: state.run.model,
    layer: state.layer,
    head: state.head,
    pos: state.pos,
  });
  if (state.key !== state.pos) params.set("key", state.key);
  if (state.sort !== "position") params.set("sort", state.sort);
  if (state.colour !== "linear") params.set("colour", state.colour);
  if (state.pool !== "max") params.set("pool", state.pool);
  if (state.temperature !== 1) params.set("t", state.temperature);
  if (state.zoom) params.set("zoom", [state.zoom.q0, state.zoom.q1, state.zoom.k0, state.zoom.k1].join(","));
  for (const extra of urlExtras) for (const [k, v] of Object.entries(extra())) params.set(k, v);
  setSearch(params);
}

// The state a URL asks for (unchecked: the caller clamps to the run it gets).
export function fromURL(query = search()) {
  const p = new URLSearchParams(query);
  const num = (k) => (p.has(k) && p.get(k) !== "" && Number.isFinite(Number(p.get(k))) ? Number(p.get(k)) : undefined);
  const zoom = (p.get("zoom") || "").split(",").map(Number);
  return {
    text: p.get("text"),
    model: p.get("model"),
    layer: num("layer"),
    head: num("head"),
    pos: num("pos"),
    key: num("key"),
    sort: p.get("sort") || undefined,
    colour: p.get("colour") || undefined,
    pool: p.get("pool") || undefined,
    temperature: num("t"),
    zoom: zoom.length === 4 && zoom.every(Number.isInteger) ? { q0: zoom[0], q1: zoom[1], k0: zoom[2], k1: zoom[3] } : null,
  };
}
