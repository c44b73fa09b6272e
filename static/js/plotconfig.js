// One plotly config for every chart: PNG from plotly's own camera button, SVG from ours.
// Nothing that would send data off this machine: plotly's cloud buttons ("Edit in Chart
// Studio", "send data to cloud") are switched off and removed.
export const CLOUD_BUTTONS = ["sendDataToCloud", "editInChartStudio"];

export function plotConfig(filename = "attnscope", { remove = [] } = {}) {
  return {
    displaylogo: false,
    responsive: true,
    showSendToCloud: false,
    showEditInChartStudio: false,
    showLink: false,
    modeBarButtonsToRemove: [...CLOUD_BUTTONS, ...remove],
    toImageButtonOptions: { format: "png", filename, scale: 2 },
    modeBarButtonsToAdd: [{
      name: "Download plot as SVG",
      icon: window.Plotly.Icons.disk,
      click: (gd) => window.Plotly.downloadImage(gd, { format: "svg", filename }),
    }],
  };
}
