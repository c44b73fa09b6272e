// Shared bits of the causal-tool views: a diverging scale, plotly calls with escaped labels.
import { plotlyText, showToken } from "../dom.js";
import { plotConfig } from "../plotconfig.js";
import { maskColours } from "../views/colour.js";

// red = hurts / lowers, blue = helps / raises; white at 0
export const DIVERGING = [[0, "#b2182b"], [0.25, "#ef8a62"], [0.5, "#f7f7f7"], [0.75, "#67a9cf"], [1, "#2166ac"]];

export const label = (s) => plotlyText(showToken(s));

// every axis grows its margin to fit its labels (row names such as "after block 3" or a
// translated title are longer than the default margin)
export function plot(div, data, layout = {}) {
  const full = { margin: { l: 60, r: 10, t: 30, b: 60 }, ...layout };
  for (const axis of ["xaxis", "yaxis", "yaxis2"]) if (axis === "xaxis" || axis === "yaxis" || full[axis]) full[axis] = { automargin: true, ...full[axis] };
  if (full.title && full.title.text) { // a title wider than the chart wraps (plotly never wraps one), the top margin grows
    const lines = wrap(full.title.text, (div.clientWidth || 600) - 20, full.title.font?.size || 12);
    full.title = { ...full.title, text: lines.join("<br>") };
    full.margin = { ...full.margin, t: Math.max(full.margin.t ?? 30, 14 + 16 * lines.length) };
  }
  return window.Plotly.react(div, data, full, plotConfig(`attnscope-${div.dataset.testid || "chart"}`));
}

// Lines of at most `width` px of (already escaped) plotly text at `size` px: broken at spaces,
// or between two Chinese characters; a Latin character counts ~0.6 em, a wide one 1 em.
export function wrap(text, width, size = 12) {
  const pieces = String(text).match(/&[a-z]+;|[\u2e80-\uffff]|\s+|[^\s\u2e80-\uffff&]+|&/g) || [];
  const w = (p) => (/^[\u2e80-\uffff]$/.test(p) ? size : (p.startsWith("&") && p.length > 1 ? 1 : p.length) * size * 0.6);
  const lines = [];
  let line = "", used = 0;
  for (const p of pieces) {
    if (used + w(p) > width && line.trim()) {
      lines.push(line.trim());
      line = "";
      used = 0;
      if (/^\s+$/.test(p)) continue;
    }
    line += p;
    used += w(p);
  }
  if (line.trim()) lines.push(line.trim());
  return lines.length ? lines : [""];
}

// a symmetric colour range around 0 for values that may be all of one sign
export function symmetric(rows) {
  let m = 0;
  for (const row of rows) for (const v of row) if (Number.isFinite(v)) m = Math.max(m, Math.abs(v));
  return m || 1;
}

export function tokenTicks(tokens, max = 48) {
  const step = Math.max(1, Math.ceil(tokens.length / max));
  const tickvals = tokens.map((_, i) => i).filter((i) => i % step === 0);
  return { tickvals, ticktext: tickvals.map((i) => label(tokens[i].text ?? tokens[i])), tickangle: -50 };
}

// The causal future of an n x n head (keys after the query, above the diagonal) as one hatched
// triangle in position coordinates, drawn under the heatmap: masked cells and bins are null in z,
// so the hatching (the legend's mask, as in the explorer's heatmap) shows through only there.
export function maskTriangle(n) {
  const mask = maskColours();
  return {
    type: "scatter", mode: "lines", x: [-0.5, n - 0.5, n - 0.5, -0.5], y: [-0.5, -0.5, n - 0.5, -0.5], fill: "toself",
    hoverinfo: "skip", showlegend: false, line: { width: 0, color: "rgba(0,0,0,0)" }, fillcolor: mask.fill,
    fillpattern: { shape: "/", bgcolor: mask.fill, fgcolor: mask.hatch, size: 6, solidity: 0.25 },
  };
}
