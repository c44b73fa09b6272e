// Drawing the selected head: its heatmap (a short run's slice, or a long run's tiles) and caption,
// the selected query's row (focus), the selected cell's readout, and the next-token chart.
import { $, isAbort, showToken } from "../dom.js";
import { getAttentionBin, getAttentionF32, getNext, getRow } from "../api.js";
import { rowOf } from "../slice.js";
import { state, set, toURL, ui } from "../state.js";
import { cellText, drawHeatmap } from "../views/heatmap.js";
import { inductionText, pending, scoreText } from "../views/headgrid.js";
import { drawFocusBars, drawFocusLines, focusNote } from "../views/focus.js";
import { drawNext } from "../views/nexttoken.js";
import { t } from "../i18n.js";
import { report } from "./errors.js";
import { isLong, shown, showZoomInputs, tileView, tiles } from "./zoom.js";

const sliceCache = new Map(); // "run:layer:head" -> binary slice, for this page's runs
const exactCache = new Map(); // "run:layer:head" -> exact float32 cells, for hover

// What a drawn heatmap answers (hover, clicks, zooms: selection.js's wireHeatmap), given once by
// the controller; called after each draw, it wires the plotly chart the first time.
export function wireWith(fn) {
  ui.wireHeatmap = fn;
}

// Hand the page back to the browser between two pieces of long work, so that a click, a script
// call or a frame is answered in between; each piece is marked ("attnscope:<name>" when it
// starts) for the Performance panel, bench/browser.py and the tests.
export async function pause(name) {
  await new Promise((resolve) => setTimeout(resolve, 0));
  performance.mark(`attnscope:${name}`);
}

function cached(cache, key, load) {
  if (!cache.has(key)) cache.set(key, load().catch((err) => { cache.delete(key); throw err; }));
  return cache.get(key);
}

export function headCaption(run, layer, head) {
  const score = run.heads.find((h) => h.layer === layer && h.head === head);
  $("#heat-title").textContent = t("x.heat.tokens", { n: shown() }); // a generation's step: the tokens it had
  $("#heat-caption").textContent = t("x.heat.title", { layer, head, entropy: scoreText(score.entropy, 2), prev: scoreText(score.prev_token, 2), first: scoreText(score.first_token, 2) }) +
    (score.induction === null && !pending(score) ? "" : t("x.heat.induction", { ind: inductionText(score, 2, run) })) +
    (state.extent === null ? "" : t("x.heat.scores_whole", { n: run.tokens.length })); // the scores are the whole run's
}

// The timeline's label at step k of its max: "after k of N generated tokens", or all of them.
export function labelTimeline(k) {
  const total = Number($("#timeline").max);
  $("#timeline-value").textContent = k === total ? t("x.timeline.all", { n: total }) : t("x.timeline.step", { k, n: total });
}

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
  ui.wireHeatmap($("#heatmap"));
  toURL();
}

export async function drawHead() {
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
  if (state.extent !== null) { // another head drawn whole: the timeline goes back to its end
    state.extent = null;
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
  ui.wireHeatmap(div);
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
export async function drawFocus() {
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
  if (ui.focusRequest) ui.focusRequest.abort();
  const controller = new AbortController();
  ui.focusRequest = controller;
  try {
    const values = await getRow(run.run_id, layer, head, pos, 0, run.causal ? pos + 1 : run.tokens.length, { signal: controller.signal });
    if (controller !== ui.focusRequest) return;
    state.row = { run, layer, head, pos, values };
    show(values, true);
    readout();
  } catch (err) {
    if (!isAbort(err) && controller === ui.focusRequest) report(err);
  }
}

// The next-token chart at the selected position, `delay` ms from now (the temperature slider
// asks as it moves: the last position wins).
export function drawNextSoon(delay = 0) {
  clearTimeout(ui.nextTimer);
  ui.nextTimer = setTimeout(async () => {
    const { run, pos, temperature } = state;
    const panel = $(".next-panel");
    if (!state.model || !state.model.has_lm_head) {
      panel.hidden = true;
      return;
    }
    panel.hidden = false;
    $("#next-title").textContent = t("x.next.title", { pos, token: showToken(run.tokens[pos].text) });
    try {
      const next = await getNext(run.run_id, pos, temperature);
      if (state.run === run && state.pos === pos) drawNext($("#next-chart"), $("#next-actual"), next);
    } catch (err) {
      report(err);
    }
  }, delay);
}

// The selected cell in words under the heatmap.
export function readout() {
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
