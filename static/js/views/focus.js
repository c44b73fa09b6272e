// Where one token reads from, for the selected head: a bar over the visible source
// tokens, and BertViz-style lines from the token to the tokens it attends to most.
// A long row (more than ALL_BARS keys) shows its TOP_KEYS heaviest keys, in position order,
// and says how much of the row they hold, instead of thousands of hairline bars.
import { plotlyText, showToken, svg, fmt } from "../dom.js";
import { plotConfig } from "../plotconfig.js";
import { t } from "../i18n.js";

const MAX_LINES = 24;
const MAX_LABEL = 14; // characters of a token shown in a label; the rest becomes "…"
export const ALL_BARS = 64; // a row with at most this many keys shows every key
export const TOP_KEYS = 16; // a longer row shows its heaviest keys (as many as the chart can label)

export function short(s, max = MAX_LABEL) {
  const chars = [...showToken(s)];
  return chars.length > max ? `${chars.slice(0, max - 1).join("")}…` : chars.join("");
}

// The k largest weights of a row as [weight, key] pairs, heaviest first (one pass, no full sort).
export function topKeys(row, k) {
  const top = []; // ascending by weight, at most k long
  for (let j = 0; j < row.length; j++) {
    const w = row[j];
    if (top.length === k && w <= top[0][0]) continue;
    let at = 0;
    while (at < top.length && top[at][0] < w) at++;
    top.splice(at, 0, [w, j]);
    if (top.length > k) top.shift();
  }
  return top.reverse();
}

// What the bars show: every key of a short row, or the top keys of a long one (position order).
export function focusKeys(row) {
  if (row.length <= ALL_BARS) return { keys: Array.from(row, (_, j) => j), all: true };
  return { keys: topKeys(row, TOP_KEYS).map(([, j]) => j).sort((a, b) => a - b), all: false };
}

// exact: the weights are float32 from the server; otherwise the 8-bit view of the heatmap's bytes.
// A short row: one vertical bar a key. A long row: its top keys as horizontal bars, in position
// order down the chart, each labelled with its position and token.
export function drawFocusBars(div, row, tokens, pos, { exact = false } = {}) {
  const { keys, all } = focusKeys(row);
  const w = keys.map((j) => Number(row[j]));
  const view = exact ? "" : t("x.focus.eight_bit");
  const hovertext = keys.map((j, i) => plotlyText(`${j} ${showToken(tokens[j].text)}: ${w[i].toPrecision(3)}${view}`));
  const marker = { color: keys.map((j) => (j === pos ? "#8b1f8f" : "#2171b5")) };
  let data, layout;
  if (all) {
    const step = Math.max(1, Math.ceil(row.length / 24));
    const tickvals = keys.filter((j) => j % step === 0);
    data = [{ type: "bar", x: keys, y: w, marker, hovertext, hoverinfo: "text" }];
    layout = {
      margin: { l: 44, r: 12, t: 8, b: 20 }, bargap: 0.1,
      xaxis: { tickvals, ticktext: tickvals.map((j) => plotlyText(short(tokens[j].text))), tickangle: -60, automargin: true },
      yaxis: { title: { text: t("x.focus.y") }, range: [0, Math.max(0.05, ...w) * 1.05], automargin: true },
    };
  } else {
    const labels = keys.map((j) => `#${j}`);
    data = [{ type: "bar", orientation: "h", x: w, y: labels, marker, hovertext, hoverinfo: "text" }];
    layout = {
      margin: { l: 8, r: 12, t: 8, b: 34 }, bargap: 0.15,
      xaxis: { title: { text: t("x.focus.y") }, range: [0, Math.max(1e-6, ...w) * 1.08], automargin: true, nticks: 4, tickformat: ".2~g" },
      yaxis: { type: "category", autorange: "reversed", tickvals: labels, automargin: true, tickfont: { size: 10 },
               ticktext: keys.map((j) => plotlyText(`${j} ${short(tokens[j].text, 10)}`)) },
    };
  }
  div.dataset.keys = String(row.length);
  div.dataset.shown = String(keys.length);
  return window.Plotly.react(div, data, layout, plotConfig("attnscope-focus"));
}

// What the bars leave out, in words: empty for a row shown whole.
export function focusNote(row) {
  const { keys, all } = focusKeys(row);
  if (all) return "";
  let total = 0, shown = 0;
  for (let j = 0; j < row.length; j++) total += Number(row[j]);
  for (const j of keys) shown += Number(row[j]);
  return t("x.focus.top", { k: keys.length, n: row.length.toLocaleString("en-US"), mass: fmt(total > 0 ? (100 * shown) / total : 0, 1) });
}

// Labels are measured once drawn, so the lines end where the longest label still fits.
export function drawFocusLines(root, row, tokens, pos) {
  root.replaceChildren();
  const top = topKeys(row, MAX_LINES).sort((a, b) => a[1] - b[1]);
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
