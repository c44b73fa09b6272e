// The selection: the selected cell (query and key), token and head, by click, keyboard or the
// head grid, and the panels that follow it (the head grid, the causal tools).
import { $ } from "../dom.js";
import { getTile } from "../api.js";
import { state, set, toURL, ui } from "../state.js";
import { markSelected } from "../views/tokens.js";
import { cellText, wireHover } from "../views/heatmap.js";
import { HeadGrid } from "../views/headgrid.js";
import { binOf, binText } from "../views/tiled.js";
import { Tools } from "../tools/tools.js"; // causal tools (issue 17): attribution, ablation, patching, lens, residual, compare
import { report, showError } from "./errors.js";
import { drawFocus, drawHead, drawNextSoon, readout } from "./draw.js";
import { isLong, noteWheel, onRelayout, tiles } from "./zoom.js";

export const grid = new HeadGrid($("#head-grid"), { onSelect: (layer, head) => selectHead(layer, head), onError: report, getTile, note: $("#grid-note"),
  onSource: (source) => { $("#badge-src-prompt").hidden = source === "corpus"; $("#badge-src-corpus").hidden = source !== "corpus"; } });
$("#grid-filter")?.addEventListener("change", (ev) => grid.setFilter(ev.target.value)); // badges and rules: the grid's filter
export const tools = new Tools($("#tools"), { selectHead, error: showError, prompt: () => $("#prompt").value, setCorpus });

// The head map's badges and labels from a corpus survey (the Corpus tab), or from the prompt again (null);
// the badge legend says which (the grid's onSource), for the runs of the survey's own model only.
function setCorpus(corpus) {
  grid.setCorpus(corpus);
}
// "Why here?" under the heatmap: the selected cell's QK attribution, in the tools panel
$("#why-here").addEventListener("click", () => {
  tools.open("qk");
  $("#tools").scrollIntoView({ block: "start" });
});

function moveCell() {
  const div = $("#heatmap");
  if (!div.layout) return;
  const { pos: q, key: k } = state;
  window.Plotly.relayout(div, { shapes: [{ type: "rect", x0: k - 0.5, x1: k + 0.5, y0: q - 0.5, y1: q + 0.5, line: { color: "#d6336c", width: 2 }, layer: "above" }] });
}

export function selectCell(pos, key = pos) {
  const before = state.pos, keyBefore = state.key;
  const visible = state.run.causal ? Math.min(key, pos) : key;
  set({ pos, key: Math.max(0, visible) });
  markSelected($("#tokens"), pos);
  moveCell();
  drawFocus();
  readout();
  drawNextSoon();
  toURL();
  if (pos !== before) tools.update("pos", state);
  else if (state.key !== keyBefore) tools.update("key", state);
}

export function selectPos(pos) {
  selectCell(pos, pos);
}

export async function selectHead(layer, head) {
  set({ layer, head });
  grid.select(layer, head);
  try {
    await drawHead();
  } catch (err) {
    report(err);
  }
  tools.update("head", state);
}

// Arrow keys move the selected cell (the query with up/down, the key with left/right).
export function heatmapKeys(ev) {
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

// The heatmap's hover, clicks and zooms, wired once (after its first draw: plotly's events need a plot).
export function wireHeatmap(div) {
  if (ui.hoverWired) return;
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
  div.addEventListener("wheel", () => noteWheel(), { passive: true, capture: true });
  ui.hoverWired = true;
}
