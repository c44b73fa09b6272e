// Direct logit attribution at the focused position: each head's own output, each MLP, the
// embeddings and the biases as terms of one logit (or of a difference of two logits).
import { getJSON } from "../api.js";
import { el, fmt, plotlyText, showToken } from "../dom.js";
import { DIVERGING, symmetric } from "./common.js";
import { plot } from "../chart.js";
import { t } from "../i18n.js";

/** What the model does to its logits after the LM head (soft-cap, scale), said in the page's language. */
function finalNote(steps) {
  const said = steps.map((st) => t(`attr.final.${st.op}`, { v: String(st.value), s: st.setting }));
  return t("attr.final", { steps: said.join(t("attr.final.and")) });
}

function candidates(run, pos) {
  const pred = run.predictions[pos];
  const seen = new Map();
  if (pred && pred.actual_next) seen.set(pred.actual_next.id, t("attr.prompt_next", { token: showToken(pred.actual_next.token) }));
  for (const c of pred ? pred.top : []) if (!seen.has(c.id)) seen.set(c.id, `${showToken(c.token)} (p=${fmt(c.prob, 3)})`);
  return [...seen].map(([id, text]) => el("option", { value: String(id), text }));
}

export async function render(body, ctx) {
  const { run, pos } = ctx;
  // each select has a label (its visible words, for= its id) and a name that says what it picks
  const tokenPick = el("select", { id: "attribution-token", "data-testid": "attribution-token", "aria-label": t("attr.token_aria") }, ...candidates(run, pos));
  const minusPick = el("select", { id: "attribution-token-b", "data-testid": "attribution-token-b", "aria-label": t("attr.token_b_aria") },
    el("option", { value: "", text: t("attr.nothing") }), ...candidates(run, pos));
  if (ctx.params.token && [...tokenPick.options].some((o) => o.value === ctx.params.token)) tokenPick.value = ctx.params.token;
  const chart = el("div", { class: "chart tool-chart", "data-testid": "attribution-heatmap" });
  const summary = el("p", { class: "legend", "data-testid": "attribution-summary" });
  body.replaceChildren(
    el("div", { class: "tool-controls" }, el("label", { for: tokenPick.id, text: t("attr.logit_of") }), tokenPick,
      el("label", { for: minusPick.id, text: t("attr.minus") }), minusPick,
      el("span", { class: "muted", text: t("attr.at", { pos, token: showToken(run.tokens[pos].text) }) })),
    chart, summary);

  async function draw() {
    const params = new URLSearchParams({ position: pos }); // no token: the server's own top prediction
    if (tokenPick.value) params.set("token", tokenPick.value); // none offered (a run without predictions here)
    if (minusPick.value) params.set("token_b", minusPick.value);
    const a = await getJSON(`/api/runs/${encodeURIComponent(run.run_id)}/attribution?${params}`);
    const L = run.n_layers;
    const H = run.n_heads;
    // a model without attention biases (Llama, Qwen3…) has no bias terms: no empty column for them
    const hasBias = a.terms.some((term) => term.kind === "bias" && term.layer !== null);
    const mlpCol = hasBias ? H + 1 : H;
    const cols = [...Array.from({ length: H }, (_, h) => t("common.head", { i: h })), ...(hasBias ? [t("attr.bias")] : []), t("tool.mlp")];
    const z = Array.from({ length: L }, () => new Array(mlpCol + 1).fill(null));
    const sums = { embed: 0, heads: 0, biases: 0, mlps: 0, shift: 0 };
    for (const term of a.terms) {
      if (term.kind === "head") { z[term.layer][term.head] = term.value; sums.heads += term.value; }
      else if (term.kind === "bias" && term.layer !== null) { z[term.layer][H] = term.value; sums.biases += term.value; }
      else if (term.kind === "mlp") { z[term.layer][mlpCol] = term.value; sums.mlps += term.value; }
      else if (term.kind === "embed") sums.embed += term.value;
      else sums.shift += term.value;
    }
    const m = symmetric(z.map((r) => r.filter((v) => v !== null)));
    const what = a.token_b ? `logit(${showToken(a.token.token)}) − logit(${showToken(a.token_b.token)})` : `logit(${showToken(a.token.token)})`;
    await plot(chart, [{ type: "heatmap", z, x: cols, y: Array.from({ length: L }, (_, i) => t("common.layer", { i })),
      colorscale: DIVERGING, zmin: -m, zmax: m, xgap: 1, ygap: 1,
      hovertemplate: "%{y} · %{x}: %{z:.3f}<extra></extra>", colorbar: { title: { text: "logit" } } }],
    { title: { text: plotlyText(t("attr.title", { what })), font: { size: 12 } }, yaxis: { autorange: "reversed" } });
    chart.dataset.sum = String(a.terms.reduce((s, term) => s + term.value, 0));
    chart.dataset.logit = String(a.logit);
    chart.dataset.error = String(a.error);
    const f = (v) => fmt(v, 3);
    summary.textContent = t(hasBias ? "attr.summary" : "attr.summary.nobias", { what, logit: f(a.logit), embed: f(sums.embed),
      heads: f(sums.heads), biases: f(sums.biases), mlps: f(sums.mlps), shift: f(sums.shift),
      residue: a.error.toExponential(1) }) + (a.final_steps.length ? t("attr.note", { note: finalNote(a.final_steps) }) : "");
  }
  await draw();
  chart.on("plotly_click", (ev) => {
    const pt = ev.points[0];
    const head = pt.pointIndex[1];
    if (head < run.n_heads) ctx.selectHead(pt.pointIndex[0], head);
  });
  tokenPick.addEventListener("change", () => { ctx.error(""); draw().catch((e) => ctx.error(e)); });
  minusPick.addEventListener("change", () => { ctx.error(""); draw().catch((e) => ctx.error(e)); });
}
