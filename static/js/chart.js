// The one plotly helper of the Learn views and the causal tools: plot() draws a chart with
// escaped labels, margins that grow to fit them, and the page's one plotly config.
//
// A chart comes in one of two frames. A figure (made by figure(), as every lesson's charts are)
// holds its title in its <figcaption> as page text, which wraps at any width, and puts its legend
// above the plot area. A bare chart div (the tools') keeps its title inside the chart, wrapped
// here, since plotly never wraps one.
import { el, plotlyText, showToken } from "./dom.js";
import { plotConfig } from "./plotconfig.js";

export const label = (s) => plotlyText(showToken(s));

// A chart div inside a <figure> whose caption holds the chart's title as page text: it wraps
// at any width, where a plotly title would be cut. Place `div.box` in the page.
export function figure(testid, cls = "chart") {
  const div = el("div", { class: cls, "data-testid": testid });
  div.box = el("figure", { class: "fig" }, el("figcaption", { class: "caption", "data-testid": `${testid}-title` }), div);
  return div;
}

// A figure's legend sits above the plot area and pushes the margin (never over the bars); axis
// titles push their margins too, so nothing is clipped at 390 px.
const FIGURE = {
  base: {
    margin: { l: 56, r: 12, t: 28, b: 56 },
    legend: { orientation: "h", x: 0, xanchor: "left", y: 1.02, yanchor: "bottom" },
    font: { family: 'system-ui, "Noto Sans CJK SC", "WenQuanYi Zen Hei", sans-serif', size: 12 },
    hoverlabel: { font: { family: 'ui-monospace, "DejaVu Sans Mono", "WenQuanYi Zen Hei", monospace' } },
  },
  axes: [], // the axes that grow their margin even where the layout names none
};
// A bare chart: every axis grows its margin to fit its labels (row names such as "after block 3"
// or a translated title are longer than the default margin).
const CHART = { base: { margin: { l: 60, r: 10, t: 30, b: 60 } }, axes: ["xaxis", "yaxis"] };

const unescape = (s) => String(s).replace(/&lt;/g, "<").replace(/&gt;/g, ">").replace(/&amp;/g, "&");

export function plot(div, data, layout = {}) {
  const frame = div.box ? FIGURE : CHART;
  const full = { ...frame.base, ...layout };
  if (frame.base.legend) full.legend = { ...frame.base.legend, ...(layout.legend || {}) };
  const named = Object.keys(layout).filter((k) => /^[xy]axis\d*$/.test(k));
  for (const axis of new Set([...frame.axes, ...named])) full[axis] = { automargin: true, ...full[axis] };
  if (full.title && div.box) { // the figure's caption says it
    div.box.querySelector("figcaption").textContent = unescape(full.title.text);
    delete full.title;
  } else if (full.title && full.title.text) { // a title wider than the chart wraps, the top margin grows
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
