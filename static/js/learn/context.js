// 1. Attention aggregates context: an RNN's n-1 state updates vs one attention step, then
// weights vs what each source actually adds, on a head where the two differ.
import { el, fmt, showToken } from "../dom.js";
import { getJSON } from "../api.js";
import { fillOptions, headName, tokenAxis } from "./charts.js";
import { figure, label, plot } from "../chart.js";

// The head whose weights and contributions disagree most at `position`, preferring one
// whose largest weight and largest contribution are different tokens.
export function pickHead(gaps) {
  const differ = gaps.filter((g) => g.top_weight !== g.top_share);
  const pool = differ.length ? differ : gaps;
  return pool.reduce((a, g) => (g.gap > a.gap ? g : a), pool[0]);
}

export async function render(body, ctx) {
  const { run, t } = ctx;
  const n = run.tokens.length;
  const last = n - 1;
  const gaps = await getJSON(`/api/runs/${run.run_id}/contribution-gaps?position=${last}`);
  const best = pickHead(gaps.heads);
  const layerSel = el("select", { "data-testid": "context-layer" });
  const headSel = el("select", { "data-testid": "context-head" });
  const posSel = el("select", { "data-testid": "context-pos" });
  const path = figure("context-path");
  const pathNote = el("p", { class: "muted", "data-testid": "context-path-note" });
  const chart = figure("context-chart", "chart tall");
  const why = el("p", { class: "muted", "data-testid": "context-default" });
  const note = el("p", { class: "muted", "data-testid": "context-note" });
  body.replaceChildren(el("div", { class: "wide" }, path.box, pathNote), el("div", { class: "controls" }, layerSel, headSel, posSel),
    el("div", { class: "wide" }, chart.box, why, note));
  const labels = () => {
    layerSel.setAttribute("aria-label", t("x.layer"));
    headSel.setAttribute("aria-label", t("x.head"));
    posSel.setAttribute("aria-label", t("common.position"));
    fillOptions(layerSel, run.n_layers, (i) => t("common.layer", { i }));
    fillOptions(headSel, run.n_heads, (i) => t("common.head", { i }));
    fillOptions(posSel, n, (i) => `${i} ${showToken(run.tokens[i].text)}`);
  };
  labels();
  layerSel.value = String(best.layer);
  headSel.value = String(best.head);
  posSel.value = String(last);
  let data = null; // the contributions of the selected head and position

  async function paintPath() {
    const steps = run.tokens.map((_, j) => last - j);
    const x = run.tokens.map((_, j) => j);
    const tokens = run.tokens.map((tk) => tk.text);
    await plot(path, [
      { type: "bar", name: t("context.path.rnn"), x, y: steps, marker: { color: "#bdbdbd" },
        hovertemplate: t("context.path.hover_rnn", { last }) + "<extra></extra>" },
      { type: "bar", name: t("context.path.attn"), x, y: x.map(() => 1), marker: { color: "#08306b" },
        hovertemplate: t("context.path.hover_attn", { last }) + "<extra></extra>" },
    ], { barmode: "group", title: { text: t("context.path.title", { last, token: label(run.tokens[last].text) }), font: { size: 12 }, x: 0, xanchor: "left" },
      xaxis: tokenAxis(tokens), yaxis: { title: { text: t("context.path.y") }, rangemode: "tozero", dtick: Math.max(1, Math.ceil(last / 6)) },
      margin: { t: 16 } });
  }

  function paintText() {
    const [layer, head] = [Number(layerSel.value), Number(headSel.value)];
    const w0 = data && data.position === last ? data.weights[0] : null;
    pathNote.textContent = n < 2 ? t("context.path.one_token") : t("context.path.note", {
      first: showToken(run.tokens[0].text), last, lastTok: showToken(run.tokens[last].text), steps: last,
      head: headName(t, layer, head), w: w0 === null ? "—" : fmt(w0, 2),
    });
    why.textContent = t("context.default", { head: headName(t, best.layer, best.head), gap: fmt(best.gap, 2),
      min: fmt(Math.min(...gaps.heads.map((g) => g.gap)), 2) });
    if (!data) return;
    const tw = data.weights.indexOf(Math.max(...data.weights));
    const ts = data.share.indexOf(Math.max(...data.share));
    const tok = (i) => showToken(run.tokens[i].text);
    note.textContent = tw !== ts
      ? t("context.note.differ", { tw, ttok: tok(tw), w: fmt(data.weights[tw], 2), ts, stok: tok(ts), s: fmt(data.share[ts], 2), ws: fmt(data.weights[ts], 2) })
      : t("context.note.same", { i: tw, tok: tok(tw), w: fmt(data.weights[tw], 2), s: fmt(data.share[ts], 2), gap: fmt(data.gap, 2) });
  }

  async function paintChart() {
    if (!data) return;
    const tokens = run.tokens.slice(0, data.weights.length).map((x) => x.text);
    const x = tokens.map((_, i) => i);
    await plot(chart, [
      { type: "bar", name: t("context.weight"), x, y: data.weights, marker: { color: "#6baed6" },
        hovertemplate: `${t("context.weight")}: %{y:.3f}<extra>%{x}</extra>` },
      { type: "bar", name: t("context.share"), x, y: data.share, marker: { color: "#08306b" },
        hovertemplate: `${t("context.share_short")}: %{y:.3f}<extra>%{x}</extra>` },
    ], { barmode: "group", xaxis: tokenAxis(tokens), yaxis: { range: [0, 1], title: { text: t("context.y") } },
      title: { text: t("context.chart.title", { head: headName(t, data.layer, data.head), pos: data.position, token: label(run.tokens[data.position].text) }), font: { size: 12 }, x: 0, xanchor: "left" },
      margin: { t: 16 } });
  }

  async function load(draw = true) {
    const [layer, head, position] = [layerSel.value, headSel.value, posSel.value].map(Number);
    const c = await getJSON(`/api/runs/${run.run_id}/contributions?layer=${layer}&head=${head}&position=${position}`);
    const total = c.contributions.reduce((a, b) => a + b, 0) || 1;
    const share = c.contributions.map((v) => v / total);
    const gap = 0.5 * c.weights.reduce((a, w, i) => a + Math.abs(w - share[i]), 0);
    data = { ...c, share, gap };
    chart.dataset.layer = String(layer);
    chart.dataset.head = String(head);
    ctx.link({ layer, head, pos: position });
    if (!draw) return;
    paintText();
    await paintChart();
  }
  for (const s of [layerSel, headSel, posSel]) s.addEventListener("change", () => load().catch((e) => ctx.error(e)));
  await load(false);
  await ctx.paint(async () => {
    labels();
    paintText();
    await Promise.all([paintPath(), paintChart()]);
  });
}
