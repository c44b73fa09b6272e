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
