// Where one token reads from, for the selected head: a bar over the visible source
// tokens, and BertViz-style lines from the token to the tokens it attends to most.
import { plotlyText, showToken, svg, fmt } from "../dom.js";
import { rowOf } from "../api.js";
import { plotConfig } from "../plotconfig.js";

const MAX_LINES = 24;

export function drawFocusBars(div, slice, tokens, pos) {
  const row = Array.from(rowOf(slice, pos));
  const x = row.map((_, j) => j);
  const data = [{
    type: "bar", x, y: row, marker: { color: row.map((_, j) => (j === pos ? "#8b1f8f" : "#2171b5")) },
    hovertext: row.map((w, j) => plotlyText(`${j} ${showToken(tokens[j].text)}: ${fmt(w, 4)}`)), hoverinfo: "text",
  }];
  const step = Math.max(1, Math.ceil(row.length / 24));
  const tickvals = x.filter((j) => j % step === 0);
  const layout = {
    margin: { l: 40, r: 8, t: 8, b: 70 }, bargap: 0.1,
    xaxis: { tickvals, ticktext: tickvals.map((j) => plotlyText(showToken(tokens[j].text))), tickangle: -60 },
    yaxis: { title: { text: "attention" }, range: [0, Math.max(0.05, ...row) * 1.05] },
  };
  return window.Plotly.react(div, data, layout, plotConfig("attnscope-focus"));
}

export function drawFocusLines(root, slice, tokens, pos) {
  root.replaceChildren();
  const row = Array.from(rowOf(slice, pos));
  const top = row.map((w, j) => [w, j]).sort((a, b) => b[0] - a[0]).slice(0, MAX_LINES).sort((a, b) => a[1] - b[1]);
  const width = root.clientWidth || 300;
  const lineH = 14;
  const height = Math.max(60, top.length * lineH + 20);
  root.setAttribute("viewBox", `0 0 ${width} ${height}`);
  root.style.height = `${height}px`;
  const max = Math.max(1e-9, ...top.map(([w]) => w));
  const leftX = 90, rightX = width - 110;
  const qy = height / 2;
  const label = (x, y, text, anchor, weight) => svg("text", { x, y: y + 4, "text-anchor": anchor, "font-weight": weight, text });
  root.append(label(leftX - 6, qy, `${pos} ${showToken(tokens[pos].text)}`, "end", "700"));
  top.forEach(([w, j], k) => {
    const y = 10 + k * lineH;
    root.append(svg("line", { x1: leftX, y1: qy, x2: rightX, y2: y, stroke: "#2171b5", "stroke-width": 0.5 + 5 * (w / max), "stroke-opacity": 0.15 + 0.85 * (w / max) }));
    root.append(label(rightX + 6, y, `${j} ${showToken(tokens[j].text)} ${fmt(w, 3)}`, "start", j === pos ? "700" : "400"));
  });
}
