// 6. Position information: the position table, and the same tokens in another order — where
// order changes the numbers: the position vector added at the embedding, attention (on the
// head whose pattern changes most), hidden states of the same token, and the predictions.
import { el, fmt, plotlyText, showToken } from "../dom.js";
import { getAttentionBin, getJSON, postJSON } from "../api.js";
import { rowOf } from "../slice.js";
import { drawHeatmap } from "../views/heatmap.js";
import { fillOptions, headName } from "./charts.js";
import { figure, plot } from "../chart.js";
import { sentences } from "../i18n.js";

// blue: B attends more; white: no change; grey background: masked in both
const DIVERGING = [[0, "#2166ac"], [0.5, "#ffffff"], [1, "#b2182b"]];
const A_TEXT = "the dog bites the man";
const B_TEXT = "the man bites the dog";

export async function render(body, ctx) {
  const { run, t } = ctx;
  const pos = await getJSON(`/api/models/${encodeURIComponent(run.model)}/positions?count=64`);
  const added = pos.kind === "learned" || pos.kind === "sinusoidal"; // a position vector added to the embedding
  const table = figure("positions-positions", "chart tall");
  const aLabel = el("span"), bLabel = el("span");
  const aBox = el("input", { value: A_TEXT, "data-testid": "positions-a" });
  const bBox = el("input", { value: B_TEXT, "data-testid": "positions-b" });
  const go = el("button", { type: "button", "data-testid": "positions-compare" });
  const layerSel = el("select", { "data-testid": "positions-layer" });
  const headSel = el("select", { "data-testid": "positions-head" });
  const headNote = el("p", { class: "muted", "data-testid": "positions-head-note" });
  const heatA = el("div", { class: "chart tall", "data-testid": "positions-heat-a" });
  const heatB = el("div", { class: "chart tall", "data-testid": "positions-heat-b" });
  const diff = figure("positions-diff", "chart tall");
  const cos = figure("positions-cos", "chart tall");
  cos.dataset.tokenLegend = "1"; // its legend names tokens (tests/i18n_check.py)
  const cosNote = el("p", { class: "muted", "data-testid": "positions-cos-note" });
  const preds = el("p", { class: "muted mono", "data-testid": "positions-preds" });
  body.replaceChildren(el("div", { class: "wide" }, table.box),
    el("div", { class: "controls" }, aLabel, aBox, bLabel, bBox, go),
    el("div", { class: "controls" }, layerSel, headSel), el("div", { class: "wide" }, headNote),
    heatA, heatB, el("div", { class: "wide" }, diff.box), el("div", { class: "wide" }, cos.box, cosNote, preds));
  let cmp = null; // {a, b, c, sa, sb, layer, head}

  async function paintTable() {
    if (pos.kind === "learned") {
      await plot(table, [{ type: "heatmap", z: pos.matrix, colorscale: "RdBu", zmid: 0, hovertemplate: t("positions.pos.hover") + "<extra></extra>" }],
        { title: { text: t("positions.pos.title", { count: pos.count, d: pos.d_model }), font: { size: 12 }, x: 0, xanchor: "left" },
          xaxis: { title: { text: t("common.dimension") } }, yaxis: { title: { text: t("common.position") }, autorange: "reversed" }, margin: { t: 8 } });
    } else if (pos.kind === "rotary") {
      await plot(table, [{ type: "heatmap", z: pos.angles, colorscale: "RdBu", zmid: 0 }],
        { title: { text: t("positions.rope.title", { dims: pos.rotary_dims, theta: pos.theta }), font: { size: 12 }, x: 0, xanchor: "left" },
          yaxis: { autorange: "reversed", title: { text: t("common.position") } }, xaxis: { title: { text: t("positions.rope.x") } }, margin: { t: 8 } });
    }
  }

  async function loadHead() {
    const [layer, head] = [Number(layerSel.value), Number(headSel.value)];
    const [sa, sb] = await Promise.all([getAttentionBin(cmp.a.run_id, layer, head), getAttentionBin(cmp.b.run_id, layer, head)]);
    Object.assign(cmp, { sa, sb, layer, head });
    ctx.link({ text: aBox.value, layer, head, pos: cmp.a.tokens.length - 1 });
  }

  async function paintCompare() {
    if (!cmp) return;
    const { a, b, c, sa, sb, layer, head } = cmp;
    fillOptions(layerSel, run.n_layers, (i) => t("common.layer", { i }));
    fillOptions(headSel, run.n_heads, (i) => t("common.head", { i }));
    const ranked = [...c.heads].sort((x, y) => y.diff - x.diff);
    const shown = c.heads.find((h) => h.layer === layer && h.head === head);
    headNote.textContent = t("positions.head_note", {
      head: headName(t, ranked[0].layer, ranked[0].head), diff: fmt(ranked[0].diff, 2),
      low: headName(t, ranked.at(-1).layer, ranked.at(-1).head), lowdiff: fmt(ranked.at(-1).diff, 2),
      shown: headName(t, layer, head), shown_diff: fmt(shown.diff, 2),
    });
    const name = headName(t, layer, head);
    await drawHeatmap(heatA, sa, a.tokens, { title: `A · ${name}` });
    await drawHeatmap(heatB, sb, b.tokens, { title: `B · ${name}` });
    const nn = Math.min(sa.n, sb.n);
    const z = Array.from({ length: nn }, (_, i) => {
      const ra = rowOf(sa, i), rb = rowOf(sb, i);
      return Array.from({ length: nn }, (_, j) => (j < ra.length && j < rb.length ? ra[j] - rb[j] : null));
    });
    const ticks = Array.from({ length: nn }, (_, i) => plotlyText(`${i} ${showToken(a.tokens[i].text)}/${showToken(b.tokens[i].text)}`));
    await plot(diff, [{ type: "heatmap", z, colorscale: DIVERGING, zmid: 0, zmin: -1, zmax: 1, colorbar: { title: { text: "A − B" }, thickness: 12 },
      hovertemplate: t("positions.diff.hover") + "<extra></extra>" }],
    { title: { text: t("positions.diff.title", { head: name }), font: { size: 12 }, x: 0, xanchor: "left" },
      xaxis: { tickvals: ticks.map((_, i) => i), ticktext: ticks, tickangle: -40, title: { text: t("positions.diff.x") }, showgrid: false, zeroline: false },
      yaxis: { tickvals: ticks.map((_, i) => i), ticktext: ticks, autorange: "reversed", title: { text: t("positions.diff.y") }, showgrid: false, zeroline: false },
      plot_bgcolor: "#e4e6ea", margin: { t: 8 } });
    const matched = c.tokens.filter((x) => x.b !== null);
    await plot(cos, matched.map((x) => ({
      type: "scatter", mode: "lines+markers", name: plotlyText(`${showToken(x.token)} ${x.a}→${x.b}`),
      x: c.stages.map((s, i) => (i === 0 ? t(added ? "positions.stage.embed_tick" : "positions.stage.embed_only_tick") : t("common.block", { i: i - 1 }))), y: x.cos_by_stage,
      line: { dash: x.a === x.b ? "dot" : "solid" },
    })), { title: { text: t("positions.cos.title"), font: { size: 12 }, x: 0, xanchor: "left" },
      yaxis: { title: { text: t("positions.cos.y") }, range: [Math.min(0, ...matched.flatMap((x) => x.cos_by_stage)) - 0.02, 1.02] }, margin: { t: 16 } });
    // where position enters: added to the embedding (learned, sinusoidal), or inside attention (rotary, ALiBi)
    const at = added ? 0 : Math.min(1, c.stages.length - 1);
    const moved = matched.filter((x) => x.a !== x.b).sort((x, y) => x.cos_by_stage[at] - y.cos_by_stage[at]);
    const stayed = matched.filter((x) => x.a === x.b && x.a > 0).sort((x, y) => x.cos - y.cos);
    const parts = [];
    if (!matched.length) parts.push(t("positions.cos.none"));
    if (moved.length) {
      const m = moved[0];
      parts.push(t(added ? "positions.cos.moved" : "positions.cos.moved_inside", { token: showToken(m.token), a: m.a, b: m.b,
        c0: fmt(m.cos_by_stage[0], 2), c1: fmt(m.cos_by_stage[at], 2), cl: fmt(m.cos, 2) }));
    }
    if (stayed.length) {
      const s = stayed[0];
      parts.push(t("positions.cos.stayed", { token: showToken(s.token), p: s.a, c0: fmt(s.cos_by_stage[0], 2), cl: fmt(s.cos, 2) }));
    }
    const unmatched = c.tokens.filter((x) => x.b === null);
    if (unmatched.length) parts.push(t("positions.cos.unmatched", { tokens: unmatched.map((x) => `“${showToken(x.token)}”`).join(" ") }));
    cosNote.textContent = sentences(parts);
    const last = (r) => r.predictions.at(-1).top.map((p) => `${showToken(p.token)} ${fmt(p.prob, 2)}`).join(", ");
    preds.textContent = `${t("positions.preds")}\nA “${aBox.value}” → ${last(a)}\nB “${bBox.value}” → ${last(b)}`;
  }

  async function compare() {
    const [a, b] = await Promise.all([aBox.value, bBox.value].map((text) => postJSON("/api/runs", { text, model: run.model, top_k: 3 })));
    const c = await getJSON(`/api/compare?a=${a.run_id}&b=${b.run_id}`);
    const top = c.heads.reduce((x, h) => (h.diff > x.diff ? h : x), c.heads[0]);
    cmp = { a, b, c };
    fillOptions(layerSel, run.n_layers, (i) => t("common.layer", { i }));
    fillOptions(headSel, run.n_heads, (i) => t("common.head", { i }));
    layerSel.value = String(top.layer);
    headSel.value = String(top.head);
    await loadHead();
    diff.dataset.layer = String(top.layer);
    diff.dataset.head = String(top.head);
  }
  const labels = () => {
    aLabel.textContent = t("positions.a");
    bLabel.textContent = t("positions.b");
    go.textContent = t("positions.compare");
  };
  go.addEventListener("click", () => compare().then(paintCompare).catch((e) => ctx.error(e)));
  for (const s of [layerSel, headSel]) s.addEventListener("change", () => loadHead().then(paintCompare).catch((e) => ctx.error(e)));
  await compare();
  await ctx.paint(async () => {
    labels();
    await Promise.all([paintTable(), paintCompare()]);
  });
}
