// One plotly config for every chart: PNG from plotly's own camera button, SVG from ours.
// Nothing that would send data off this machine: plotly's cloud buttons ("Edit in Chart
// Studio", "send data to cloud") are switched off and removed.
import { plotlyLocale, t } from "./i18n.js";

export const CLOUD_BUTTONS = ["sendDataToCloud", "editInChartStudio"];

export function plotConfig(filename = "attnscope", { remove = [] } = {}) {
  return {
    displaylogo: false,
    responsive: true,
    locale: plotlyLocale(), // plotly's own words in the page's language
    showSendToCloud: false,
    showEditInChartStudio: false,
    showLink: false,
    modeBarButtonsToRemove: [...CLOUD_BUTTONS, ...remove],
    toImageButtonOptions: { format: "png", filename, scale: 2 },
    modeBarButtonsToAdd: [{
      name: t("plot.svg"),
      icon: window.Plotly.Icons.disk,
      click: (gd) => window.Plotly.downloadImage(gd, { format: "svg", filename }),
    }],
  };
}

// Keyboard: plotly makes every mode-bar button a tab stop (8-9 per chart, so reaching the
// next control took dozens of Tabs). Each chart's mode bar becomes one toolbar with one tab
// stop (its first button; Left/Right/Home/End move inside it, as WAI-ARIA's toolbar pattern),
// and none at all when the chart itself takes focus (the explorer's heatmap: arrow keys move
// its cell). One observer for the whole page, so views that call Plotly themselves get it too.
function toolbar(bar) {
  const buttons = [...bar.querySelectorAll(".modebar-btn")];
  if (!buttons.length) return;
  bar.setAttribute("role", "toolbar");
  bar.setAttribute("aria-label", t("plot.toolbar"));
  const chart = bar.closest(".js-plotly-plot");
  const own = chart && chart.tabIndex >= 0; // the chart is a tab stop already
  const current = buttons.find((b) => b.tabIndex === 0 && b.dataset.roving === "1");
  for (const b of buttons) {
    b.dataset.roving = "1";
    b.tabIndex = !own && b === (current || buttons[0]) ? 0 : -1;
  }
}

function tame(root) {
  if (!(root instanceof Element)) return;
  const bars = root.matches(".modebar") ? [root] : [...root.querySelectorAll(".modebar")];
  const inside = root.closest(".modebar");
  if (inside) bars.push(inside);
  for (const bar of bars) toolbar(bar);
}

function keys(ev) {
  const from = ev.target;
  if (!(from instanceof Element) || !from.matches(".modebar-btn")) return;
  const buttons = [...from.closest(".modebar").querySelectorAll(".modebar-btn")];
  const i = buttons.indexOf(from);
  const next = { ArrowRight: i + 1, ArrowLeft: i - 1, Home: 0, End: buttons.length - 1 }[ev.key];
  if (next === undefined) return;
  ev.preventDefault();
  const to = buttons[(next + buttons.length) % buttons.length];
  for (const b of buttons) b.tabIndex = b === to ? 0 : -1;
  to.focus();
}

export function tameModeBars() {
  if (window.__attnscopeModeBars) return;
  window.__attnscopeModeBars = true;
  tame(document.body);
  new MutationObserver((records) => {
    for (const r of records) for (const n of r.addedNodes) tame(n.nodeType === 1 ? n : n.parentElement);
  }).observe(document.body, { childList: true, subtree: true });
  document.addEventListener("keydown", keys);
}
if (document.body) tameModeBars();
else document.addEventListener("DOMContentLoaded", tameModeBars);
