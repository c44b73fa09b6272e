// The attention heatmap of one head: queries down, keys across, the causal mask hatched.
import { plotlyText, showToken, fmt } from "../dom.js";
import { rowOf } from "../api.js";
import { SCALE } from "./colour.js";
import { plotConfig } from "../plotconfig.js";

const MAX_TICKS = 48;

function ticks(tokens) {
  const step = Math.max(1, Math.ceil(tokens.length / MAX_TICKS));
  const vals = [];
  const text = [];
  for (let i = 0; i < tokens.length; i += step) {
    vals.push(i);
    text.push(plotlyText(`${showToken(tokens[i].text)}`));
  }
  return { tickvals: vals, ticktext: text };
}

// The masked future as one staircase polygon under the heatmap (masked cells are
// null in z, so the hatching shows through only there).
function maskTrace(n) {
  const x = [0.5, n - 0.5, n - 0.5];
  const y = [-0.5, -0.5, n - 1.5];
  for (let i = n - 2; i >= 0; i--) {
    x.push(i + 0.5, i + 0.5);
    y.push(i + 0.5, i - 0.5);
  }
  return {
    type: "scatter", mode: "lines", x, y, fill: "toself", hoverinfo: "skip", showlegend: false,
    line: { width: 0, color: "rgba(0,0,0,0)" },
    fillcolor: "#e4e6ea",
    fillpattern: { shape: "/", bgcolor: "#e4e6ea", fgcolor: "#aab1ba", size: 6, solidity: 0.25 },
  };
}

export function drawHeatmap(div, slice, tokens, { colour = "linear", title = "" } = {}) {
  const n = slice.n;
  const z = new Array(n);
  for (let i = 0; i < n; i++) {
    const row = rowOf(slice, i);
    const full = new Array(n).fill(null);
    for (let j = 0; j < row.length; j++) full[j] = colour === "sqrt" ? Math.sqrt(row[j]) : row[j];
    z[i] = full;
  }
  const tk = ticks(tokens);
  const colorbar = colour === "sqrt"
    ? { title: { text: "weight" }, tickvals: [0, 0.1, 0.3, 0.5, 0.7, 1].map(Math.sqrt), ticktext: ["0", "0.1", "0.3", "0.5", "0.7", "1"], thickness: 12 }
    : { title: { text: "weight" }, thickness: 12 };
  const heat = {
    type: "heatmap", z, zmin: 0, zmax: 1, colorscale: SCALE, hoverinfo: "none", xgap: 0, ygap: 0, colorbar,
  };
  const traces = slice.causal && n > 1 ? [maskTrace(n), heat] : [heat];
  const layout = {
    margin: { l: 90, r: 10, t: 80, b: 28 },
    title: { text: plotlyText(title), font: { size: 12 }, y: 0.005, yanchor: "bottom" },
    xaxis: { side: "top", tickangle: -60, ...tk, range: [-0.5, n - 0.5], showgrid: false, zeroline: false, title: { text: "key (read from)", standoff: 4 } },
    yaxis: { autorange: "reversed", ...tk, range: [n - 0.5, -0.5], showgrid: false, zeroline: false, title: { text: "query (reading)" } },
    plot_bgcolor: "#ffffff",
    dragmode: "zoom",
  };
  const config = { ...plotConfig("attnscope-heatmap"), modeBarButtonsToRemove: ["select2d", "lasso2d"] };
  return window.Plotly.react(div, traces, layout, config);
}

// Our own tooltip (plain text): the two tokens and the weight.
export function wireHover(div, tip, getState) {
  div.on("plotly_hover", (ev) => {
    const pt = ev.points.find((p) => p.data.type === "heatmap");
    if (!pt) return;
    const { run, slice } = getState();
    const q = pt.y, k = pt.x;
    const row = rowOf(slice, q);
    const masked = slice.causal && k > q;
    const tq = run.tokens[q], tk = run.tokens[k];
    tip.textContent = masked
      ? `query ${q} ${showToken(tq.text)}\nkey ${k} ${showToken(tk.text)}\nmasked: a future token`
      : `query ${q} ${showToken(tq.text)}\nkey ${k} ${showToken(tk.text)}\nweight ≈ ${fmt(row[k], 4)}`;
    const box = div.getBoundingClientRect();
    const host = div.parentElement.getBoundingClientRect();
    tip.style.left = `${ev.event.clientX - host.left + 14}px`;
    tip.style.top = `${ev.event.clientY - host.top + 14}px`;
    tip.hidden = !(ev.event.clientX >= box.left);
  });
  div.on("plotly_unhover", () => { tip.hidden = true; });
}
