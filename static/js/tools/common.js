// Shared bits of the causal-tool views: a diverging scale, token ticks, the causal mask (their
// charts are drawn by ../chart.js, labels escaped: token text is untrusted).
import { label } from "../chart.js";
import { el, fmt } from "../dom.js";
import { t } from "../i18n.js";
import { maskColours } from "../views/colour.js";

// A long tool run's progress line: the seconds so far against the estimate, and a Cancel button
// that aborts the request (the server stops between forwards when its client goes away).
// `start(estimate)` returns the AbortSignal to fetch with; `stop()` clears the line.
export function longRun(testid) {
  const text = el("span", { "data-testid": `${testid}-elapsed` });
  const cancel = el("button", { type: "button", "data-testid": `${testid}-cancel`, text: t("tool.cancel") });
  const box = el("p", { class: "legend tool-progress", role: "status", "data-testid": testid, hidden: "" }, text, " ", cancel);
  let timer = null, controller = null;
  cancel.addEventListener("click", () => controller && controller.abort());
  return {
    box,
    start(estimate) {
      controller = new AbortController();
      const t0 = performance.now();
      const tick = () => {
        const s = (performance.now() - t0) / 1000;
        text.textContent = estimate > 0 ? t("tool.progress_of", { s: fmt(s, 0), est: fmt(estimate, 0) }) : t("tool.progress", { s: fmt(s, 0) });
      };
      tick();
      clearInterval(timer);
      timer = setInterval(tick, 500);
      box.hidden = false;
      return controller.signal;
    },
    stop() {
      clearInterval(timer);
      box.hidden = true;
      controller = null;
    },
  };
}

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
