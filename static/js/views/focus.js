// Where one token reads from, for the selected head: a bar over the visible source
// tokens, and BertViz-style lines from the token to the tokens it attends to most.
import { plotlyText, showToken, svg, fmt } from "../dom.js";
import { rowOf } from "../api.js";
import { plotConfig } from "../plotconfig.js";
import { t } from "../i18n.js";

const MAX_LINES = 24;
const MAX_LABEL = 14; // characters of a token shown in a label; the rest becomes "…"

export function short(s, max = MAX_LABEL) {
  const chars = [...showToken(s)];
  return chars.length > max ? `${chars.slice(0, max - 1).join("")}…` : chars.join("");
}

export function drawFocusBars(div, slice, tokens, pos) {
  const row = Array.from(rowOf(slice, pos));
  const x = row.map((_, j) => j);
  const data = [{
    type: "bar", x, y: row, marker: { color: row.map((_, j) => (j === pos ? "#8b1f8f" : "#2171b5")) },
    hovertext: row.map((w, j) => plotlyText(`${j} ${showToken(tokens[j].text)}: ${Number(w).toPrecision(3)} (8-bit view)`)), hoverinfo: "text",
  }];
  const step = Math.max(1, Math.ceil(row.length / 24));
  const tickvals = x.filter((j) => j % step === 0);
  const layout = {
    margin: { l: 44, r: 12, t: 8, b: 20 }, bargap: 0.1,
    xaxis: { tickvals, ticktext: tickvals.map((j) => plotlyText(short(tokens[j].text))), tickangle: -60, automargin: true },
    yaxis: { title: { text: t("x.focus.y") }, range: [0, Math.max(0.05, ...row) * 1.05], automargin: true },
  };
  return window.Plotly.react(div, data, layout, plotConfig("attnscope-focus"));
}

// Labels are measured once drawn, so the lines end where the longest label still fits.
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
  const qy = height / 2;
  const label = (y, text, anchor, weight) => svg("text", { x: 0, y: y + 4, "text-anchor": anchor, "font-weight": weight, text });
  const query = label(qy, `${pos} ${short(tokens[pos].text)}`, "end", "700");
  const targets = top.map(([w, j], k) => label(10 + k * lineH, `${j} ${short(tokens[j].text)} ${fmt(w, 3)}`, "start", j === pos ? "700" : "400"));
  root.append(query, ...targets);
  const measure = (t) => { try { return t.getComputedTextLength(); } catch (_) { return 0; } };
  const leftX = Math.min(width * 0.4, measure(query) + 6);
  const rightX = Math.max(leftX + 30, width - Math.max(0, ...targets.map(measure)) - 8);
  query.setAttribute("x", String(leftX - 4));
  targets.forEach((t) => t.setAttribute("x", String(rightX + 4)));
  top.forEach(([w], k) => {
    const y = 10 + k * lineH;
    root.insertBefore(svg("line", { x1: leftX, y1: qy, x2: rightX, y2: y, stroke: "#2171b5", "stroke-width": 0.5 + 5 * (w / max), "stroke-opacity": 0.15 + 0.85 * (w / max) }), query);
  });
}
