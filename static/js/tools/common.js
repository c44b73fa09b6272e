// Shared bits of the causal-tool views: a diverging scale, token ticks, the causal mask (their
// charts are drawn by ../chart.js, labels escaped: token text is untrusted).
import { label } from "../chart.js";
import { maskColours } from "../views/colour.js";

// red = hurts / lowers, blue = helps / raises; white at 0
export const DIVERGING = [[0, "#b2182b"], [0.25, "#ef8a62"], [0.5, "#f7f7f7"], [0.75, "#67a9cf"], [1, "#2166ac"]];

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
