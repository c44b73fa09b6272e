// Small plotly helpers shared by the Learn views (labels escaped: token text is untrusted).
import { plotlyText, showToken } from "../dom.js";
import { plotConfig } from "../plotconfig.js";

export const label = (s) => plotlyText(showToken(s));

// A legend above the plotting area (never over the data): margin.t grows with its entries.
export function legendAbove(entries) {
  return { legend: { orientation: "h", x: 0, xanchor: "left", y: 1.02, yanchor: "bottom" }, margin: { l: 50, r: 10, t: 24 + 20 * entries, b: 60 } };
}

// Axes grow their margins to fit their labels (automargin), so nothing is cut at the panel edge.
export function plot(div, data, layout = {}) {
  const full = { margin: { l: 50, r: 10, t: 24, b: 60 }, ...layout };
  for (const axis of ["xaxis", "yaxis", "yaxis2"]) if (axis !== "yaxis2" || full.yaxis2) full[axis] = { automargin: true, ...(full[axis] || {}) };
  return window.Plotly.react(div, data, full, plotConfig(`attnscope-${div.dataset.testid || "chart"}`));
}

export function tokenAxis(tokens, max = 40) {
  const step = Math.max(1, Math.ceil(tokens.length / max));
  const tickvals = tokens.map((_, i) => i).filter((i) => i % step === 0);
  return { tickvals, ticktext: tickvals.map((i) => label(tokens[i])), tickangle: -50 };
}
