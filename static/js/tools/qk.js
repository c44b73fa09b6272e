// QK attribution ("Why here?"): why the selected head attends from the focused query to the selected
// key. Its pre-softmax logit q·k split into query-side × key-side terms, one per upstream component
// (embeddings, each earlier head, each earlier MLP, biases): a matrix of the largest terms (the rest
// summed as "other") and one bar chart per side. Labels are escaped by ../chart.js (token text is untrusted).
import { getJSON } from "../api.js";
import { el, fmt, plotlyText, showToken } from "../dom.js";
import { DIVERGING, symmetric } from "./common.js";
import { plot } from "../chart.js";
import { t } from "../i18n.js";

const TOP = 10; // components per side in the matrix (6 on a narrow screen)
const BARS = 12; // components per side in the bar charts

/**
 * @typedef {{kind: string, layer: number|null, head: number|null}} Component
 * @typedef {{layer: number, head: number, query: number, keys: number[], components: Component[],
 *   query_side: number[][], key_side: number[][], matrix: number[][]|null, logit: number[], position_bias: number[],
 *   capped: number[], softcap: number|null, weight: number[], error: number[]}} QKResult
 */

/** A component's name in the page's language. @param {Component} c */
export function componentLabel(c) {
  if (c.kind === "head") return t("qk.c.head", { l: c.layer, h: c.head });
  if (c.kind === "mlp") return t("qk.c.mlp", { l: c.layer });
  if (c.kind === "out_bias") return t("qk.c.out_bias", { l: c.layer });
  return t(`qk.c.${c.kind}`);
}

/** The indices of the k largest values by size. @param {number[]} values @param {number} k */
export function largest(values, k) {
  return values.map((v, i) => [Math.abs(v), i]).sort((a, b) => b[0] - a[0]).slice(0, k).map(([, i]) => i);
}

const sum = (xs) => xs.reduce((s, v) => s + v, 0);

/** The matrix cut to the largest rows and columns, with one "other" row and column holding the rest.
 * @param {number[][]} m @param {number[]} rows @param {number[]} cols */
export function cut(m, rows, cols) {
  const inRows = new Set(rows), inCols = new Set(cols);
  const restRows = m.map((_, i) => i).filter((i) => !inRows.has(i));
  const restCols = m[0].map((_, j) => j).filter((j) => !inCols.has(j));
  const pick = (r) => [...cols.map((j) => sum(r.map((i) => m[i][j]))), sum(r.map((i) => sum(restCols.map((j) => m[i][j]))))];
  return [...rows.map((i) => pick([i])), pick(restRows)];
}

async function bars(div, labels, values, title) {
  const order = largest(values, BARS).reverse(); // the largest at the top
  await plot(div, [{ type: "bar", orientation: "h", x: order.map((i) => values[i]), y: order.map((i) => plotlyText(labels[i])),
    marker: { color: order.map((i) => (values[i] >= 0 ? "#2166ac" : "#b2182b")) },
    hovertemplate: "%{y}: %{x:.3f}<extra></extra>" }],
  { title: { text: plotlyText(title), font: { size: 12 } }, margin: { l: 90, r: 10, t: 30, b: 30 }, xaxis: { zeroline: true } });
}

export async function render(body, ctx) {
  const { run, pos, layer, head } = ctx;
  const key = Math.min(ctx.key ?? pos, run.causal ? pos : run.tokens.length - 1);
  const title = el("p", { class: "legend", "data-testid": "qk-title", text: t("qk.title", {
    layer, head, q: pos, qt: showToken(run.tokens[pos].text), k: key, kt: showToken(run.tokens[key].text) }) });
  const explainer = el("p", { class: "legend muted", "data-testid": "qk-explainer", text: t("qk.explain") });
  const matrix = el("div", { class: "chart tool-chart square", "data-testid": "qk-matrix" });
  const qBars = el("div", { class: "chart tool-chart short", "data-testid": "qk-query-bars" });
  const kBars = el("div", { class: "chart tool-chart short", "data-testid": "qk-key-bars" });
  const summary = el("p", { class: "legend", "data-testid": "qk-summary" });
  body.replaceChildren(title, explainer, el("div", { class: "qk-charts" }, matrix, el("div", { class: "qk-bars" }, qBars, kBars)), summary);
  const params = new URLSearchParams({ layer, head, query: pos, key });
  /** @type {QKResult} */
  const a = await getJSON(`/api/runs/${encodeURIComponent(run.run_id)}/qk-attribution?${params}`);
  const m = a.matrix || [];
  const labels = a.components.map(componentLabel);
  const qSide = m.map((row) => sum(row));
  const kSide = labels.map((_, j) => sum(m.map((row) => row[j])));
  const narrow = (matrix.clientWidth || 600) < 520;
  const top = narrow ? 6 : TOP;
  const rows = largest(qSide, top), cols = largest(kSide, top);
  const z = cut(m, rows, cols);
  const other = t("qk.c.other");
  await plot(matrix, [{ type: "heatmap", z, x: [...cols.map((j) => plotlyText(labels[j])), other],
    y: [...rows.map((i) => plotlyText(labels[i])), other], colorscale: DIVERGING, zmin: -symmetric(z), zmax: symmetric(z),
    xgap: 1, ygap: 1, hovertemplate: "%{y} × %{x}: %{z:.3f}<extra></extra>", colorbar: { title: { text: "logit" } } }],
  { title: { text: plotlyText(t("qk.matrix")), font: { size: 12 } }, yaxis: { autorange: "reversed", title: { text: t("qk.rows") } },
    xaxis: { title: { text: t("qk.cols") }, tickangle: narrow ? -90 : -45 }, margin: { l: 90, r: 10, t: 40, b: 90 } });
  await bars(qBars, labels, qSide, t("qk.query_side"));
  await bars(kBars, labels, kSide, t("qk.key_side"));
  const terms = sum(m.map((row) => sum(row)));
  matrix.dataset.sum = String(terms);
  matrix.dataset.logit = String(a.logit[0]);
  matrix.dataset.error = String(a.error[0]);
  matrix.dataset.top = JSON.stringify({ query: a.components[rows[0]], key: a.components[cols[0]] });
  const f = (v) => fmt(v, 3);
  summary.textContent = t("qk.summary", { logit: f(a.logit[0]), terms: f(terms), bias: f(a.position_bias[0]),
    error: Number(a.error[0]).toExponential(1), weight: f(a.weight[0]) })
    + (a.softcap !== null ? t("qk.capped", { capped: f(a.capped[0]) }) : "");
}
