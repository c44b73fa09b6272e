// Shared bits of the causal-tool views: a diverging scale, plotly calls with escaped labels.
import { plotlyText, showToken } from "../dom.js";
import { plotConfig } from "../plotconfig.js";

// red = hurts / lowers, blue = helps / raises; white at 0
export const DIVERGING = [[0, "#b2182b"], [0.25, "#ef8a62"], [0.5, "#f7f7f7"], [0.75, "#67a9cf"], [1, "#2166ac"]];

export const label = (s) => plotlyText(showToken(s));

export function plot(div, data, layout = {}) {
  return window.Plotly.react(div, data, { margin: { l: 60, r: 10, t: 30, b: 60 }, ...layout },
    plotConfig(`attnscope-${div.dataset.testid || "chart"}`));
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
