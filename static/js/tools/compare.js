// One head on two prompts side by side, and their difference (B − A) where the prompts
// have the same positions. Long prompts (more than TILE tokens) are compared as tiles: both heads
// over their common positions pooled into the same TILE x TILE bins (each the max of its cells),
// so the difference is bin by bin — a whole long head is never fetched.
import { getAttentionBin, getTile, postJSON } from "../api.js";
import { rowOf } from "../slice.js";
import { TILE } from "../views/tiled.js";
import { el, fmt } from "../dom.js";
import { SCALE } from "../views/colour.js";
import { DIVERGING, maskTriangle, tokenTicks } from "./common.js";
import { plot } from "../chart.js";
import { t } from "../i18n.js";

function dense(slice) {
  const z = [];
  for (let i = 0; i < slice.n; i++) {
    const row = Array.from(rowOf(slice, i));
    while (row.length < slice.n) row.push(null); // the causal mask
    z.push(row);
  }
  return z;
}

// A tile's values as plotly rows (null where a bin has no visible cell).
function rowsOf(tile) {
  return Array.from({ length: tile.rows }, (_, i) => Array.from(tile.values.subarray(i * tile.cols, (i + 1) * tile.cols),
    (v) => (Number.isNaN(v) ? null : v)));
}

// edges: {x, y} bin boundaries of a pooled tile (positions on the axes), or null for one cell a token;
// causal: the head masks the future (hatched under the heatmap, never white like a zero weight)
function draw(div, z, tokens, title, diff = false, edges = null, causal = false) {
  const ticks = edges ? { tickformat: "d", tickangle: -50 } : tokenTicks(tokens, 32);
  const where = edges ? { x: Array.from(edges.x, (e) => e - 0.5), y: Array.from(edges.y, (e) => e - 0.5) } : {};
  const n = edges ? edges.x[edges.x.length - 1] : z.length;
  const heat = { type: "heatmap", z, ...where, colorscale: diff ? DIVERGING : SCALE, zmin: diff ? -1 : 0, zmax: 1,
    hovertemplate: t(edges ? "cmp.hover_bin" : "cmp.hover"), showscale: diff };
  div.dataset.masked = causal && n > 1 ? "1" : "0";
  return plot(div, causal && n > 1 ? [maskTriangle(n), heat] : [heat],
  { title: { text: title, font: { size: 12 } }, xaxis: ticks, yaxis: { ...ticks, autorange: "reversed", tickangle: 0 },
    margin: { l: 70, r: 10, t: 30, b: 70 } });
}

// Both runs' head over their first n positions as TILE x TILE max-pooled tiles (the same bins).
async function compareTiles(ctx, run, runB, { a, b, d, box, note }) {
  const n = Math.min(run.tokens.length, runB.tokens.length);
  const ask = (id) => getTile(id, { layer: ctx.layer, head: ctx.head, q0: 0, q1: n, k0: 0, k1: n, size: TILE, pool: "max" });
  const [ta, tb] = await Promise.all([ask(run.run_id), ask(runB.run_id)]);
  const za = rowsOf(ta), zb = rowsOf(tb);
  const zd = za.map((row, i) => row.map((v, j) => (v === null || zb[i][j] === null ? null : zb[i][j] - v)));
  const edges = { x: ta.kEdges, y: ta.qEdges };
  const causal = ta.causal && tb.causal;
  await draw(a, za, run.tokens, t("cmp.a", { layer: ctx.layer, head: ctx.head }), false, edges, causal);
  await draw(b, zb, runB.tokens, t("cmp.b", { layer: ctx.layer, head: ctx.head }), false, edges, causal);
  await draw(d, zd, runB.tokens, "B − A", true, edges, causal);
  let biggest = 0;
  for (const row of zd) for (const v of row) if (v !== null) biggest = Math.max(biggest, Math.abs(v));
  box.dataset.n = String(n);
  box.dataset.maxDiff = String(biggest);
  box.dataset.pooled = ta.exact ? "0" : "1";
  const na = run.tokens.length, nb = runB.tokens.length;
  const w = Math.floor(n / ta.rows), wHi = Math.ceil(n / ta.rows);
  note.textContent = (na === nb ? t("cmp.same", { n }) : t("cmp.differ", { a: na, b: nb, n })) +
    (ta.exact ? "" : t("cmp.pooled", { bins: ta.rows, w: w === wHi ? String(w) : `${w}–${wHi}` })) +
    t("cmp.largest", { d: fmt(biggest, 3) });
}

// The default second prompt: the same tokens in another order, as in the seed's "dog bites man":
// the second and third words swapped (both after a space, each keeps its own tokens, so the two
// prompts line up position by position: "The cat sat" -> "The sat cat"; swapping the first word
// took its space to another and changed the count, 14 -> 15), else the first two words, or, in text
// without spaces (Chinese), the first two different characters.
export function reordered(text) {
  const middle = text.replace(/^(\W*\w+\W*? )(\w+) (\w+)\b/, (m, lead, a, b) => (a === b ? m : `${lead}${b} ${a}`));
  if (middle !== text) return middle;
  const swapped = text.replace(/\b(\w+) (\w+)\b/, "$2 $1");
  if (swapped !== text) return swapped;
  const chars = Array.from(text);
  const i = chars.findIndex((c, k) => k + 1 < chars.length && /\S/.test(c) && /\S/.test(chars[k + 1]) && c !== chars[k + 1]);
  if (i < 0) return text;
  [chars[i], chars[i + 1]] = [chars[i + 1], chars[i]];
  return chars.join("");
}

export async function render(body, ctx) {
  const { run } = ctx;
  const other = el("input", { type: "text", class: "patch-input", "data-testid": "compare-prompt", spellcheck: "false" });
  other.value = ctx.params.compare ?? reordered(ctx.prompt());
  const go = el("button", { type: "button", "data-testid": "compare-run", text: t("cmp.run") });
  const a = el("div", { class: "chart tool-chart square", "data-testid": "compare-a" });
  const b = el("div", { class: "chart tool-chart square", "data-testid": "compare-b" });
  const d = el("div", { class: "chart tool-chart square", "data-testid": "compare-diff" });
  const note = el("p", { class: "legend tool-result", "data-testid": "compare-note" });
  const box = el("div", { class: "compare-charts", "data-testid": "head-compare" }, a, b, d);
  body.replaceChildren(el("div", { class: "tool-controls" }, t("cmp.head", { layer: ctx.layer, head: ctx.head }), other, go), ctx.alert, note, box);

  async function compare() {
    go.disabled = true;
    ctx.error("");
    try {
      ctx.setParams({ compare: other.value });
      const runB = await postJSON("/api/runs", { text: other.value, model: run.model, top_k: 1 });
      if (run.tokens.length > TILE || runB.tokens.length > TILE) {
        await compareTiles(ctx, run, runB, { a, b, d, box, note });
        return;
      }
      box.dataset.pooled = "0";
      const [sa, sb] = await Promise.all([getAttentionBin(run.run_id, ctx.layer, ctx.head), getAttentionBin(runB.run_id, ctx.layer, ctx.head)]);
      const za = dense(sa);
      const zb = dense(sb);
      const n = Math.min(sa.n, sb.n);
      const zd = Array.from({ length: n }, (_, i) => Array.from({ length: n }, (_, j) =>
        (za[i][j] === null || zb[i][j] === null ? null : zb[i][j] - za[i][j])));
      await draw(a, za, run.tokens, t("cmp.a", { layer: ctx.layer, head: ctx.head }), false, null, sa.causal);
      await draw(b, zb, runB.tokens, t("cmp.b", { layer: ctx.layer, head: ctx.head }), false, null, sb.causal);
      await draw(d, zd, runB.tokens.slice(0, n), "B − A", true, null, sa.causal && sb.causal);
      let biggest = 0;
      for (const row of zd) for (const v of row) if (v !== null) biggest = Math.max(biggest, Math.abs(v));
      box.dataset.n = String(n);
      box.dataset.maxDiff = String(biggest);
      note.textContent = (sa.n === sb.n ? t("cmp.same", { n }) : t("cmp.differ", { a: sa.n, b: sb.n, n })) +
        t("cmp.largest", { d: fmt(biggest, 3) });
    } catch (err) {
      ctx.error(err);
    } finally {
      go.disabled = false;
    }
  }
  go.addEventListener("click", compare);
  await compare();
}
