// The logit lens: each stage of the residual stream read through the final norm and the LM
// head; the top token and its probability, stage by position.
import { getJSON } from "../api.js";
import { el, plotlyText, showToken } from "../dom.js";
import { SCALE } from "../views/colour.js";
import { tokenTicks } from "./common.js";
import { label, plot } from "../chart.js";
import { t } from "../i18n.js";

const MAX_POSITIONS = 64;
const FONT = 9; // px, the cells' text
const PLOT_MARGIN = 150; // px of the chart outside its cells: stage names, colour bar

// A token cut to fit `px` pixels of cell at FONT px (a wide character ~1 em, others ~0.6 em), with
// an ellipsis; "" when not even two characters fit (the cells' colours and the hover remain).
export function fitLabel(token, px) {
  const chars = [...showToken(token)];
  const w = (c) => (/[\u2e80-\uffff]/.test(c) ? FONT : 0.6 * FONT);
  const room = px - 4;
  if (chars.reduce((a, c) => a + w(c), 0) <= room) return plotlyText(chars.join(""));
  let used = w("…"), out = "";
  for (const c of chars) {
    if (used + w(c) > room) break;
    out += c;
    used += w(c);
  }
  return [...out].length >= 2 ? plotlyText(`${out}…`) : "";
}

export async function render(body, ctx) {
  const { run, pos } = ctx;
  const lens = await getJSON(`/api/runs/${encodeURIComponent(run.run_id)}/logit-lens?top_k=1`);
  const n = run.tokens.length;
  // a window of at most MAX_POSITIONS positions that ends at (or holds) the focused one
  const lo = Math.max(0, Math.min(pos - MAX_POSITIONS + 1 + Math.floor(MAX_POSITIONS / 4), n - MAX_POSITIONS));
  const hi = Math.min(n, lo + MAX_POSITIONS);
  const xs = Array.from({ length: hi - lo }, (_, i) => lo + i);
  const chart = el("div", { class: "chart tool-chart tall", "data-testid": "logit-lens" });
  body.replaceChildren(el("p", { class: "legend", text: t("lens.help", { lo, hi: hi - 1, n }) }), chart);
  // the stage names in the page's language (the server's labels are English)
  const stages = lens.layers.map((l) => (l.layer < 0 ? t("tool.embed") : t("common.block", { i: l.layer })));
  const z = lens.layers.map((l) => xs.map((i) => l.positions[i].top[0].prob));
  // the full token in the hover; in the cell only what fits its width (no text runs into the next cell)
  const cell = Math.max(0, ((chart.clientWidth || body.clientWidth || 600) - PLOT_MARGIN) / xs.length);
  const full = lens.layers.map((l) => xs.map((i) => label(l.positions[i].top[0].token)));
  const text = lens.layers.map((l) => xs.map((i) => fitLabel(l.positions[i].top[0].token, cell)));
  const ticks = tokenTicks(run.tokens.slice(lo, hi));
  await plot(chart, [{ type: "heatmap", x: xs, y: stages, z, text, texttemplate: "%{text}", customdata: full,
    textfont: { size: FONT }, colorscale: SCALE, zmin: 0, zmax: 1,
    hovertemplate: t("lens.hover").replace("%{text}", "%{customdata}") }],
  { xaxis: { tickvals: ticks.tickvals.map((i) => i + lo), ticktext: ticks.ticktext, tickangle: -50 },
    shapes: pos >= lo && pos < hi ? [{ type: "rect", x0: pos - 0.5, x1: pos + 0.5, y0: -0.5, y1: lens.layers.length - 0.5, line: { color: "#8b1f8f", width: 2 } }] : [] });
  chart.dataset.stages = String(lens.layers.length);
  chart.dataset.positions = String(xs.length);
}
