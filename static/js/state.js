// The explorer's state in one object. `set` changes it; the controller (main.js and explorer/)
// redraws the views a change affects, and toURL / fromURL mirror it in the address bar.
import { search, setSearch } from "./page.js";

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
