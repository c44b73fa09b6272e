// Small plotly helpers shared by the Learn views (labels escaped: token text is untrusted).
import { el, plotlyText, showToken } from "../dom.js";
import { plotConfig } from "../plotconfig.js";

export const label = (s) => plotlyText(showToken(s));

// A chart div inside a <figure> whose caption holds the chart's title as page text: it wraps
// at any width, where a plotly title would be cut. Place `div.box` in the page.
export function figure(testid, cls = "chart") {
  const div = el("div", { class: cls, "data-testid": testid });
  div.box = el("figure", { class: "fig" }, el("figcaption", { class: "caption", "data-testid": `${testid}-title` }), div);
  return div;
}

const unescape = (s) => String(s).replace(/&lt;/g, "<").replace(/&gt;/g, ">").replace(/&amp;/g, "&");

// Legends sit above the plot area and push the margin (never over the bars); axis titles
// push their margins too, so nothing is clipped at 390 px.
export function plot(div, data, layout = {}) {
  const base = {
    margin: { l: 56, r: 12, t: 28, b: 56 },
    legend: { orientation: "h", x: 0, xanchor: "left", y: 1.02, yanchor: "bottom" },
    font: { family: 'system-ui, "Noto Sans CJK SC", "WenQuanYi Zen Hei", sans-serif', size: 12 },
    hoverlabel: { font: { family: 'ui-monospace, "DejaVu Sans Mono", "WenQuanYi Zen Hei", monospace' } },
  };
  if (layout.title && div.box) {
    div.box.querySelector("figcaption").textContent = unescape(layout.title.text);
    layout = { ...layout };
    delete layout.title;
  }
  const axes = {};
  for (const k of Object.keys(layout)) {
    if (/^[xy]axis\d*$/.test(k)) axes[k] = { automargin: true, ...layout[k] };
  }
  return window.Plotly.react(div, data, { ...base, ...layout, ...axes, legend: { ...base.legend, ...(layout.legend || {}) } },
    plotConfig(`attnscope-${div.dataset.testid || "chart"}`));
}

export function tokenAxis(tokens, max = 40, offset = 0) {
  const step = Math.max(1, Math.ceil(tokens.length / max));
  const tickvals = tokens.map((_, i) => i + offset).filter((i) => (i - offset) % step === 0);
  return { tickvals, ticktext: tickvals.map((i) => label(tokens[i - offset])), tickangle: -50, automargin: true };
}

// "layer 2 head 5" in the current language
// The first stage's name: "embedding + position" when the model adds a position vector to the
// embedding (learned, sinusoidal), plain "embedding" when position enters inside attention
// (rotary, ALiBi) or nowhere. `model` is an entry of /api/models.
export const addsPosition = (model) => model.position_encoding === "learned" || model.position_encoding === "sinusoidal";
export const embedStage = (t, model) => t(addsPosition(model) ? "l6.stage.embed" : "l6.stage.embed_only");
export const headName = (t, layer, head) => t("common.layer_head", { layer, head });

// A select filled with count options labelled by fn(i); keeps its value across repaints.
export function fillOptions(select, count, fn) {
  const keep = select.value;
  select.replaceChildren(...Array.from({ length: count }, (_, i) => {
    const o = document.createElement("option");
    o.value = String(i);
    o.textContent = fn(i);
    return o;
  }));
  if (keep !== "") select.value = keep;
}
