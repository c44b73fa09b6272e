// Zoom: the range boxes, plotly's drag, wheel and double-click zooms, and a long run's tiled view
// (more than EXACT_MAX tokens: an overview first, finer tiles as one zooms) that follows them.
import { $ } from "../dom.js";
import { getTile } from "../api.js";
import { state, set, toURL, ui } from "../state.js";
import { rangesFrom, refreshPeak, tickBudget, ticks } from "../views/heatmap.js";
import { EXACT_MAX, TileView, poolingText, windowFrom } from "../views/tiled.js";
import { sentences, t } from "../i18n.js";
import { report } from "./errors.js";

// A long run (more than EXACT_MAX tokens) is drawn from tiles: an overview first, finer as one zooms.
export const isLong = (run) => run.tokens.length > EXACT_MAX;

// How many tokens the heatmap shows: the whole run, or fewer on a recorded generation's timeline.
export const shown = () => state.extent ?? state.run.tokens.length;

// What a long run's tile shows now.
export function tileView() {
  const { run, layer, head, zoom, pool, colour, pos, key, extent } = state;
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

// the heatmap's tiles (a long run)
export const tiles = new TileView($("#heatmap"), { onDrawn: tileDrawn, onError: report, getTile });

export function noteWheel() {
  ui.lastWheel = performance.now();
}

export function showZoomInputs() {
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

// A drag-zoom (or double-click reset) in plotly: the inputs, the labels and the URL follow.
export function onRelayout(ev) {
  if (ui.relabelling || !state.run) return;
  const keys = Object.keys(ev || {});
  if (!keys.some((k) => k.startsWith("xaxis.range") || k.startsWith("yaxis.range") || k.endsWith("autorange"))) return;
  $("#zoom-note").hidden = true; // it spoke of the range boxes' last zoom, which this one replaces
  if (isLong(state.run)) { // a finer (or coarser) tile of what is now in view; a burst of wheel steps asks once
    const all = keys.some((k) => k.endsWith("autorange")); // double-click: back to the overview
    set({ zoom: all ? null : windowFrom($("#heatmap"), shown()) });
    showZoomInputs();
    toURL();
    return tiles.show(tileView(), performance.now() - ui.lastWheel < 200 ? 40 : 0); // a drag asks at once
  }
  const n = state.run.tokens.length;
  const zoom = rangesFrom($("#heatmap"), n);
  set({ zoom });
  if (state.slice) refreshPeak($("#heatmap"), state.slice, zoom, state.colour);
  showZoomInputs();
  ui.relabelling = true;
  Promise.resolve(window.Plotly.relayout($("#heatmap"), relabel(zoom))).finally(() => { ui.relabelling = false; });
  toURL();
}

// The range boxes' zoom (Apply, or Enter in a box): out-of-range values are clamped and said.
export function zoom() {
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
  ui.relabelling = true;
  Promise.resolve(window.Plotly.relayout($("#heatmap"), {
    "xaxis.range": [k0 - 0.5, k1 + 0.5], "yaxis.range": [q1 + 0.5, q0 - 0.5], ...relabel(z),
  })).finally(() => { ui.relabelling = false; });
  if (state.slice) refreshPeak($("#heatmap"), state.slice, z, state.colour);
  showZoomInputs();
  toURL();
}

// How a long run's tiles pool the cells of a bin ("max" or "mean").
export function setPool(pool) {
  set({ pool });
  toURL();
  return state.run && isLong(state.run) && tiles.show(tileView());
}
