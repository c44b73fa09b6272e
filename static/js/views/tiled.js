// The heatmap of a long run, drawn from tiles: it opens on an overview (at most TILE x TILE
// bins, each the max — or mean — of the cells it covers) and asks for a finer tile of what
// is in view after every zoom (drag, wheel, the range boxes), until each bin is one token
// pair and the axes carry the tokens themselves. The newest view wins: a tile that arrives
// after a newer zoom was asked for is dropped, and its request aborted.
import { isAbort, plotlyText, showToken } from "../dom.js";
import { FAINT, SCALE, maskColours, scaleFor } from "./colour.js";
import { KEY_TICK_ANGLE, cellShape, labelMargins, tickBudget, ticks } from "./heatmap.js";
import { plotConfig } from "../plotconfig.js";
import { t } from "../i18n.js";

export const TILE = 256; // bins per axis of a tile: about one bin for every two to three screen pixels
export const EXACT_MAX = 256; // runs up to this many tokens are drawn whole, as exact cells, without tiles

const num = (v) => Number(v).toLocaleString("en-US");

// The visible window {q0, q1, k0, k1} (inclusive) of a zoomed chart, or null for the whole run.
// Rounded to whole positions and at least one cell, so a zoom inside one cell still shows it.
export function windowFrom(div, n) {
  const l = div.layout;
  const xr = l.xaxis.range, yr = l.yaxis.range;
  if (!xr || !yr) return null;
  const span = (r) => {
    const lo = Math.max(0, Math.min(n - 1, Math.round(Math.min(r[0], r[1]) + 0.5)));
    const hi = Math.max(lo, Math.min(n - 1, Math.round(Math.max(r[0], r[1]) - 0.5)));
    return [lo, hi];
  };
  const [k0, k1] = span(xr), [q0, q1] = span(yr);
  if (k0 === 0 && q0 === 0 && k1 === n - 1 && q1 === n - 1) return null;
  return { q0, q1, k0, k1 };
}

// How a tile pools, in words: "each cell = max over 64 × 64 tokens" (a range where bins differ by one).
export function poolingText(tile) {
  if (tile.exact) return t("x.tile.exact", { q: `${num(tile.q0)}–${num(tile.q1 - 1)}`, k: `${num(tile.k0)}–${num(tile.k1 - 1)}` });
  const widths = (edges) => {
    let lo = Infinity, hi = 0;
    for (let i = 1; i < edges.length; i++) { const w = edges[i] - edges[i - 1]; lo = Math.min(lo, w); hi = Math.max(hi, w); }
    return lo === hi ? num(lo) : `${num(lo)}–${num(hi)}`;
  };
  return t(tile.pool === "mean" ? "x.tile.mean" : "x.tile.max", {
    qw: widths(tile.qEdges), kw: widths(tile.kEdges), rows: tile.rows, cols: tile.cols,
    q: `${num(tile.q0)}–${num(tile.q1 - 1)}`, k: `${num(tile.k0)}–${num(tile.k1 - 1)}`,
  });
}

// The bins with no visible cell (the causal future, keys outside a sliding window) as hatched
// polygons, separated by gaps so that plotly fills each on its own. plotly draws scatter fills
// above heatmaps, so the hatching must cover the null bins only. Each polygon costs the browser
// a filled path on every redraw (a zoom redraws them all), so there are few: the null runs that
// reach a row's right edge (the causal future) form one staircase over consecutive rows, those
// that start at its left edge (before a sliding window) another, and any other run is a rectangle
// merged down with the same run in the next rows.
export function maskShapes(tile) {
  const { rows, cols, values, qEdges, kEdges } = tile;
  const runsOf = (r) => {
    const runs = [];
    for (let c = 0; c < cols; c++) {
      if (!Number.isNaN(values[r * cols + c])) continue;
      const start = c;
      while (c + 1 < cols && Number.isNaN(values[r * cols + c + 1])) c++;
      runs.push([start, c + 1]);
    }
    return runs;
  };
  const X = (c) => kEdges[c] - 0.5, Y = (r) => qEdges[r] - 0.5;
  const x = [], y = [];
  const polygon = (points) => {
    for (const [c, r] of points) { x.push(X(c)); y.push(Y(r)); }
    x.push(X(points[0][0]), null);
    y.push(Y(points[0][1]), null);
  };
  // a staircase over rows r0..r1-1: right: run [edge[r], cols) a row; left: run [0, edge[r])
  const stair = (side, r0, edgesOf) => {
    const r1 = r0 + edgesOf.length, pts = [];
    if (side === "right") {
      pts.push([edgesOf[0], r0], [cols, r0], [cols, r1]);
      for (let i = edgesOf.length - 1; i >= 0; i--) pts.push([edgesOf[i], r0 + i + 1], [edgesOf[i], r0 + i]);
    } else {
      pts.push([0, r0]);
      for (let i = 0; i < edgesOf.length; i++) pts.push([edgesOf[i], r0 + i], [edgesOf[i], r0 + i + 1]);
      pts.push([0, r1]);
    }
    polygon(pts);
  };
  const chains = { left: null, right: null }; // {r0, edges} of a staircase still growing down
  const endChain = (side) => {
    if (chains[side]) stair(side, chains[side].r0, chains[side].edges);
    chains[side] = null;
  };
  let open = new Map(); // "c0:c1" -> first row of a rectangle still growing down
  const close = (key, r0, r1) => {
    const [c0, c1] = key.split(":").map(Number);
    polygon([[c0, r0], [c1, r0], [c1, r1], [c0, r1]]);
  };
  for (let r = 0; r <= rows; r++) {
    const next = new Map();
    const seen = { left: false, right: false };
    for (const [c0, c1] of r < rows ? runsOf(r) : []) {
      const side = c1 === cols ? "right" : c0 === 0 ? "left" : null;
      if (side && !seen[side]) {
        seen[side] = true;
        if (!chains[side]) chains[side] = { r0: r, edges: [] };
        chains[side].edges.push(side === "right" ? c0 : c1);
        continue;
      }
      const key = `${c0}:${c1}`;
      next.set(key, open.has(key) ? open.get(key) : r);
    }
    for (const side of ["left", "right"]) if (!seen[side]) endChain(side);
    for (const [key, r0] of open) if (!next.has(key)) close(key, r0, r);
    open = next;
  }
  return { x, y };
}

function maskTrace(tile) {
  const mask = maskColours();
  const { x, y } = maskShapes(tile);
  return {
    type: "scatter", mode: "lines", x, y, fill: "toself", hoverinfo: "skip", connectgaps: false,
    showlegend: false, line: { width: 0, color: "rgba(0,0,0,0)" }, fillcolor: mask.fill,
    fillpattern: { shape: "/", bgcolor: mask.fill, fgcolor: mask.hatch, size: 6, solidity: 0.25 },
  };
}

// Axis labels: every token when the bins are single tokens and few enough, every step-th token
// when single but many, positions (plotly's own round numbers) when the bins pool.
function axisTicks(tokens, edges, exact, budget) {
  const a = edges[0], b = edges[edges.length - 1] - 1;
  if (exact) return { tickmode: "array", ...ticks(tokens, a, b, budget) };
  return { tickmode: "auto", nticks: Math.max(4, Math.floor(budget / 2)), tickformat: "d", tickvals: null, ticktext: null };
}

export function drawTile(div, tile, tokens, { colour = "linear", cell = null, title = "" } = {}) {
  const { rows, cols, values } = tile;
  let peak = 0; // the largest weight in the tile (NaN: masked bins)
  for (let i = 0; i < values.length; i++) if (values[i] > peak) peak = values[i];
  const scale = scaleFor(colour, peak, t("heat.weight"));
  const z = new Array(rows);
  let nulls = false;
  for (let i = 0; i < rows; i++) {
    const row = new Array(cols);
    for (let j = 0; j < cols; j++) {
      const v = values[i * cols + j];
      if (Number.isNaN(v)) { row[j] = null; nulls = true; } else row[j] = scale.map(v);
    }
    z[i] = row;
  }
  div.dataset.peak = String(peak);
  div.dataset.faint = String(colour === "linear" && peak < FAINT);
  const x = Array.from(tile.kEdges, (e) => e - 0.5), y = Array.from(tile.qEdges, (e) => e - 0.5);
  const heat = { type: "heatmap", z, x, y, zmin: 0, zmax: scale.zmax, colorscale: SCALE, hoverinfo: "none", xgap: 0, ygap: 0, colorbar: scale.colorbar };
  const x0 = x[0], x1 = x[x.length - 1], y0 = y[0], y1 = y[y.length - 1];
  const budget = tickBudget(div);
  const xTicks = axisTicks(tokens, tile.kEdges, tile.exact, budget), yTicks = axisTicks(tokens, tile.qEdges, tile.exact, budget);
  // single-token bins carry the tokens: room for them, as the short run's heatmap has (plotly's numbers: the defaults)
  const room = labelMargins(xTicks.ticktext ?? [], yTicks.ticktext ?? []);
  const layout = {
    margin: { l: room.l, r: 10, t: room.t, b: title.includes("\n") ? 46 : 28 },
    title: { text: plotlyText(title).replace(/\n/g, "<br>"), font: { size: 12 }, y: 0.012, yanchor: "bottom" },
    xaxis: { side: "top", tickangle: -KEY_TICK_ANGLE, ...xTicks, range: [x0, x1], autorange: false,
             showgrid: false, zeroline: false, title: { text: t("heat.key"), standoff: 4 } },
    yaxis: { ...yTicks, range: [y1, y0], autorange: false, showgrid: false,
             zeroline: false, title: { text: t("heat.query") } },
    plot_bgcolor: "#ffffff",
    dragmode: "zoom",
    shapes: cell ? [cellShape(cell.q, cell.k)] : [],
  };
  const traces = nulls ? [maskTrace(tile), heat] : [heat];
  const config = { ...plotConfig("attnscope-heatmap", { remove: ["select2d", "lasso2d", "autoScale2d"] }), scrollZoom: true, doubleClick: "autosize" };
  return window.Plotly.react(div, traces, layout, config);
}

// The bin under a plotly hover/click point: [row, col] of the tile.
export function binOf(pt) {
  const p = pt.pointNumber ?? pt.pointIndex;
  return Array.isArray(p) ? p : null;
}

// Tooltip text for bin (r, c): the two tokens and the exact weight for a one-token bin, the
// ranges it covers and what pooling gives for a larger one.
export function binText(tile, tokens, r, c) {
  const q = tile.qEdges[r], qe = tile.qEdges[r + 1], k = tile.kEdges[c], ke = tile.kEdges[c + 1];
  const v = tile.values[r * tile.cols + c];
  if (qe - q === 1 && ke - k === 1) {
    const head = t("heat.tip.cell", { q, qt: showToken(tokens[q].text), k, kt: showToken(tokens[k].text) });
    if (Number.isNaN(v)) return head + t("heat.tip.masked");
    return head + t(tile.eightBit ? "heat.tip.approx_plain" : "heat.tip.exact", { w: tile.eightBit ? v.toFixed(3) : v.toPrecision(4) });
  }
  const where = t("x.tile.tip.bin", { q: `${num(q)}–${num(qe - 1)}`, k: `${num(k)}–${num(ke - 1)}`, qn: num(qe - q), kn: num(ke - k) });
  if (Number.isNaN(v)) return where + t("x.tile.tip.masked");
  return where + t(tile.pool === "mean" ? "x.tile.tip.mean" : "x.tile.tip.max", { w: v.toPrecision(3) });
}

// One head's tiles, in view: show() asks for the tile of a window and draws it unless a newer
// show() came first. Reports each drawn tile (and the time from asking to drawn) to onDrawn.
export class TileView {
  // getTile(runId, spec, {signal}): the tiles' transport (api.js's getTile in the explorer)
  constructor(div, { onDrawn = () => {}, onError = () => {}, getTile }) {
    this.div = div;
    this.getTile = getTile;
    this.onDrawn = onDrawn;
    this.onError = onError;
    this.controller = null;
    this.seq = 0;
    this.tile = null;
    this.timer = 0;
  }

  // Forget the drawn tile (a new run or head): nothing stale is hovered or clicked meanwhile.
  reset() {
    this.cancel();
    this.tile = null;
  }

  cancel() {
    clearTimeout(this.timer);
    if (this.controller) this.controller.abort();
    this.controller = null;
    this.seq += 1;
  }

  // After `delay` ms (wheel and drag zooms come in bursts), fetch and draw the window's tile.
  // view: {run, layer, head, extent (tokens that exist: the run's n, or fewer on the timeline),
  //        zoom (inclusive window or null), pool, colour, cell, title}. Resolves when drawn, or
  //        to null when a newer view replaced it.
  show(view, delay = 0) {
    this.cancel();
    const seq = this.seq;
    const controller = new AbortController();
    this.controller = controller;
    const asked = performance.now();
    return new Promise((resolve, reject) => {
      const fetchAndDraw = async () => {
        try {
          const { run, layer, head, extent, zoom, pool } = view;
          const clamp = (v) => Math.max(0, Math.min(extent - 1, v));
          const w = zoom ? { q0: clamp(zoom.q0), q1: clamp(zoom.q1), k0: clamp(zoom.k0), k1: clamp(zoom.k1) }
            : { q0: 0, q1: extent - 1, k0: 0, k1: extent - 1 };
          const tile = await this.getTile(run.run_id, { layer, head, q0: w.q0, q1: w.q1 + 1, k0: w.k0, k1: w.k1 + 1, size: TILE, pool },
                                     { signal: controller.signal });
          if (seq !== this.seq) return resolve(null);
          const fetched = performance.now();
          await drawTile(this.div, tile, run.tokens, view);
          this.div.dataset.tileFetchMs = (fetched - asked - delay).toFixed(1);
          this.div.dataset.tileDrawMs = (performance.now() - fetched).toFixed(1);
          if (seq !== this.seq) return resolve(null);
          this.tile = tile;
          this.controller = null;
          const ms = performance.now() - asked - delay;
          this.onDrawn(tile, ms);
          resolve(tile);
        } catch (err) {
          if (isAbort(err) || seq !== this.seq) return resolve(null);
          this.onError(err);
          reject(err);
        }
      };
      // a drag or the range boxes ask at once (no timer hop that could wait behind a frame being
      // rendered); a wheel burst waits `delay` ms for its last step
      if (delay > 0) this.timer = setTimeout(fetchAndDraw, delay);
      else fetchAndDraw();
    });
  }
}
