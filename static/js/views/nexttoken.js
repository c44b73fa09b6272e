// The next-token distribution at the selected position, re-scaled by temperature on
// the server (exactly, over the whole vocabulary) as the slider moves: drawn from what the
// caller fetched (api.js's getNext in the explorer).
import { plotlyText, showToken, fmt } from "../dom.js";
import { plotConfig } from "../plotconfig.js";
import { t } from "../i18n.js";

export function drawNext(div, actualEl, next) {
  const top = next.top; // most likely first: rank 1 at the top of the chart
  const actualId = next.actual_next ? next.actual_next.id : null;
  const data = [{
    type: "bar", orientation: "h",
    x: top.map((c) => c.prob),
    y: top.map((c, i) => `${i + 1}`),
    text: top.map((c) => plotlyText(`${showToken(c.token)}  ${fmt(c.prob, 3)}`)),
    textposition: "auto", hoverinfo: "text",
    marker: { color: top.map((c) => (c.id === actualId ? "#8b1f8f" : "#2171b5")) },
  }];
  const layout = {
    margin: { l: 28, r: 8, t: 8, b: 30 },
    xaxis: { range: [0, 1], title: { text: t("x.next.x") } },
    yaxis: { title: { text: t("x.next.y") }, type: "category", autorange: "reversed" }, // "1" read as a number sat at the bottom
  };
  window.Plotly.react(div, data, layout, plotConfig("attnscope-next-token"));
  if (next.actual_next) {
    const a = next.actual_next;
    actualEl.textContent = t("x.next.actual", { token: showToken(a.token), p: fmt(a.prob, 4), rank: a.rank,
      entropy: fmt(next.entropy, 2), temp: fmt(next.temperature, 2) });
  } else {
    actualEl.textContent = t("x.next.last", { entropy: fmt(next.entropy, 2), temp: fmt(next.temperature, 2) });
  }
}
