// One plotly config for every chart: PNG from plotly's own camera button, SVG from ours.
export function plotConfig(filename = "attnscope") {
  return {
    displaylogo: false,
    responsive: true,
    toImageButtonOptions: { format: "png", filename, scale: 2 },
    modeBarButtonsToAdd: [{
      name: "Download plot as SVG",
      icon: window.Plotly.Icons.disk,
      click: (gd) => window.Plotly.downloadImage(gd, { format: "svg", filename }),
    }],
  };
}
