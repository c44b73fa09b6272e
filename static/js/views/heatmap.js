// The attention heatmap of one head: queries down, keys across, the causal mask hatched.
import { plotlyText, showToken } from "../dom.js";
import { rowOf } from "../slice.js";
import { FAINT, SCALE, maskColours, scaleFor } from "./colour.js";
import { plotConfig } from "../plotconfig.js";
import { t } from "../i18n.js";

export const MAX_TICKS = 48; // at most this many labels an axis; a zoom that shows fewer labels every one

// How many labels an axis of this chart can hold without overlapping (one per 13 px).
export function tickBudget(div) {
  const side = Math.min(div.clientWidth || 600, div.clientHeight || 600) - 120;
  return Math.max(6, Math.min(MAX_TICKS, Math.floor(side / 13)));
}

// Labels for the visible positions lo..hi: every one when they fit, else every step-th.
export function ticks(tokens, lo = 0, hi = tokens.length - 1, max = MAX_TICKS) {
  const a = Math.max(0, Math.ceil(lo)), b = Math.min(tokens.length - 1, Math.floor(hi));
  const step = Math.max(1, Math.ceil((b - a + 1) / max));
  const vals = [];
  const text = [];
  for (let i = a; i <= b; i += step) {
    vals.push(i);
    text.push(plotlyText(showToken(tokens[i].text)));
  }
  return { tickvals: vals, ticktext: text };
}

// The margins the axes' labels and titles need, estimated from the labels' widths (the tick font,
// measured on a canvas): plotly's automargin finds them too, but by drawing the whole chart a second
// time (half of a 256-token heatmap's drawing). automargin stays on behind this estimate, for a
// label it misjudges (a font not loaded yet). Fitted to plotly's own (left = the widest query label +
// 32 px, top = the slanted key labels' height + 44 px), with 4 px to spare on each.
const TICK_FONT = '12px "Open Sans", verdana, arial, sans-serif';
export const KEY_TICK_ANGLE = 60; // the key labels' slant (plotly's tickangle: -60)
let measurer = null;

function widest(labels) {
  measurer ??= document.createElement("canvas").getContext("2d");
  if (!measurer) return 0;
  measurer.font = TICK_FONT;
  let w = 0;
  for (const s of labels) w = Math.max(w, measurer.measureText(s).width);
  return w;
}

// {l, t} for these key (x) and query (y) labels; at least the charts' defaults (90, 80).
export function labelMargins(xLabels, yLabels) {
  const rad = (KEY_TICK_ANGLE * Math.PI) / 180;
  const slanted = widest(xLabels) * Math.sin(rad) + 14 * Math.cos(rad);
  return { l: Math.max(90, Math.ceil(widest(yLabels) + 36)), t: Math.max(80, Math.ceil(slanted + 48)) };
}

// The masked future as one staircase polygon under the heatmap (masked cells are
// null in z, so the hatching shows through only there).
function maskTrace(n) {
  const mask = maskColours();
  const x = [0.5, n - 0.5, n - 0.5];
  const y = [-0.5, -0.5, n - 1.5];
  for (let i = n - 2; i >= 0; i--) {
    x.push(i + 0.5, i + 0.5);
    y.push(i + 0.5, i - 0.5);
  }
  return {
    type: "scatter", mode: "lines", x, y, fill: "toself", hoverinfo: "skip", showlegend: false,
    line: { width: 0, color: "rgba(0,0,0,0)" },
    fillcolor: mask.fill,
    fillpattern: { shape: "/", bgcolor: mask.fill, fgcolor: mask.hatch, size: 6, solidity: 0.25 },
  };
}

// The keyboard cursor: an outlined cell.
export function cellShape(q, k) {
  return { type: "rect", x0: k - 0.5, x1: k + 0.5, y0: q - 0.5, y1: q + 0.5, line: { color: "#d6336c", width: 2 }, layer: "above" };
}

export function drawHeatmap(div, slice, tokens, { colour = "linear", title = "", zoom = null, cell = null } = {}) {
  const n = slice.n;
  const clampZ = (v) => Math.max(0, Math.min(n - 1, v));
  const zq = zoom ? [clampZ(zoom.q0), clampZ(zoom.q1)] : [0, n - 1];
  const zk = zoom ? [clampZ(zoom.k0), clampZ(zoom.k1)] : [0, n - 1];
  const peak = peakOf(slice, zq, zk); // the largest weight in view (the zoom window's, when zoomed)
  const scale = scaleFor(colour, peak, t("heat.weight"));
  const z = new Array(n);
  for (let i = 0; i < n; i++) {
    const row = rowOf(slice, i);
    const full = new Array(n).fill(null);
    for (let j = 0; j < row.length; j++) full[j] = scale.map(row[j]);
    z[i] = full;
  }
  const budget = tickBudget(div);
  const xTicks = ticks(tokens, zk[0], zk[1], budget), yTicks = ticks(tokens, zq[0], zq[1], budget);
  const room = labelMargins(xTicks.ticktext, yTicks.ticktext);
  div.dataset.peak = String(peak);
  div.dataset.faint = String(colour === "linear" && peak < FAINT);
  const heat = {
    type: "heatmap", z, zmin: 0, zmax: scale.zmax, colorscale: SCALE, hoverinfo: "none", xgap: 0, ygap: 0, colorbar: scale.colorbar,
  };
  const traces = slice.causal && n > 1 ? [maskTrace(n), heat] : [heat];
  const layout = {
    margin: { l: room.l, r: 10, t: room.t, b: title.includes("\n") ? 46 : 28 },
    title: { text: plotlyText(title).replace(/\n/g, "<br>"), font: { size: 12 }, y: 0.012, yanchor: "bottom" },
    xaxis: { side: "top", tickangle: -KEY_TICK_ANGLE, ...xTicks, range: [zk[0] - 0.5, zk[1] + 0.5], showgrid: false, zeroline: false, title: { text: t("heat.key"), standoff: 4 }, automargin: true },
    // automargin: a long token's slanted label grows the margin instead of running through the axis title
    yaxis: { ...yTicks, range: [zq[1] + 0.5, zq[0] - 0.5], showgrid: false, zeroline: false, title: { text: t("heat.query") }, automargin: true },
    plot_bgcolor: "#ffffff",
    dragmode: "zoom",
    shapes: cell ? [cellShape(cell.q, cell.k)] : [],
  };
  return window.Plotly.react(div, traces, layout, plotConfig("attnscope-heatmap", { remove: ["select2d", "lasso2d"] }));
}

// The visible ranges after a drag-zoom (null: everything), read from plotly's relayout event.
export function rangesFrom(div, n) {
  const l = div.layout;
  const xr = l.xaxis.range, yr = l.yaxis.range;
  if (!xr || !yr) return null;
  const k0 = Math.max(0, Math.ceil(Math.min(xr[0], xr[1]))), k1 = Math.min(n - 1, Math.floor(Math.max(xr[0], xr[1])));
  const q0 = Math.max(0, Math.ceil(Math.min(yr[0], yr[1]))), q1 = Math.min(n - 1, Math.floor(Math.max(yr[0], yr[1])));
  if (k0 === 0 && q0 === 0 && k1 === n - 1 && q1 === n - 1) return null;
  return { q0, q1, k0, k1 };
}

// Weight text for a reader: the exact float32 (4 significant digits) once loaded.
export function weightText(exact, approx) {
  if (exact === undefined || exact === null) return t("heat.tip.approx", { w: approx.toFixed(3) });
  return t("heat.tip.exact", { w: Number(exact).toPrecision(4) });
}

// Our own tooltip (plain text): the two tokens and the weight; textAt(point) writes it.
export function wireHover(div, tip, textAt) {
  div.on("plotly_hover", (ev) => {
    const pt = ev.points.find((p) => p.data.type === "heatmap");
    if (!pt) return;
    const text = textAt(pt);
    if (!text) return;
    tip.textContent = text;
    const box = div.getBoundingClientRect();
    const host = div.parentElement.getBoundingClientRect();
    tip.hidden = !(ev.event.clientX >= box.left);
    // beside the pointer, but never past the panel's right edge (measured: a long token widens it)
    const right = Math.min(host.width, document.documentElement.clientWidth - host.left);
    tip.style.left = `${Math.max(0, Math.min(ev.event.clientX - host.left + 14, right - tip.offsetWidth - 4))}px`;
    tip.style.top = `${ev.event.clientY - host.top + 14}px`;
  });
  div.on("plotly_unhover", () => { tip.hidden = true; });
  window.addEventListener("resize", () => { tip.hidden = true; }); // a tip placed for the old width
}

export function cellText({ run, slice, exact }, q, k) {
  const masked = slice.causal && k > q;
  const tq = run.tokens[q], tk = run.tokens[k];
  const head = t("heat.tip.cell", { q, qt: showToken(tq.text), k, kt: showToken(tk.text) });
  if (masked) return head + t("heat.tip.masked");
  const idx = slice.causal ? (q * (q + 1)) / 2 + k : q * slice.n + k;
  return head + weightText(exact && exact.length > idx ? exact[idx] : null, rowOf(slice, q)[k]);
}

// The largest weight of rows zq[0]..zq[1] x keys zk[0]..zk[1] (inclusive) of a slice.
function peakOf(slice, zq, zk) {
  let peak = 0;
  for (let i = zq[0]; i <= zq[1]; i++) {
    const row = rowOf(slice, i);
    for (let j = zk[0]; j <= Math.min(zk[1], row.length - 1); j++) if (row[j] > peak) peak = row[j];
  }
  return peak;
}

// A zoom of a short run is a relayout of the drawn heatmap: the largest weight in view is measured
// again over the zoom window (null: the whole head), and the "view" scale spans it.
export function refreshPeak(div, slice, zoom, colour) {
  const n = slice.n;
  const clampZ = (v) => Math.max(0, Math.min(n - 1, v));
  const zq = zoom ? [clampZ(zoom.q0), clampZ(zoom.q1)] : [0, n - 1];
  const zk = zoom ? [clampZ(zoom.k0), clampZ(zoom.k1)] : [0, n - 1];
  const peak = peakOf(slice, zq, zk);
  div.dataset.peak = String(peak);
  div.dataset.faint = String(colour === "linear" && peak < FAINT);
  if (colour === "view" && div.data) {
    const heat = div.data.findIndex((tr) => tr.type === "heatmap" && tr.colorscale === SCALE);
    if (heat >= 0) window.Plotly.restyle(div, { zmax: [scaleFor(colour, peak, "").zmax] }, [heat]);
  }
}
