// Direct logit attribution at the focused position: each head's own output, each MLP, the
// embeddings and the biases as terms of one logit (or of a difference of two logits).
import { getJSON } from "../api.js";
import { el, fmt, plotlyText, showToken } from "../dom.js";
import { DIVERGING, plot, symmetric } from "./common.js";

function candidates(run, pos) {
  const pred = run.predictions[pos];
  const seen = new Map();
  if (pred && pred.actual_next) seen.set(pred.actual_next.id, `${showToken(pred.actual_next.token)} (the prompt's next token)`);
  for (const c of pred ? pred.top : []) if (!seen.has(c.id)) seen.set(c.id, `${showToken(c.token)} (p=${fmt(c.prob, 3)})`);
  return [...seen].map(([id, text]) => el("option", { value: String(id), text }));
}

export async function render(body, ctx) {
  const { run, pos } = ctx;
  const tokenPick = el("select", { "data-testid": "attribution-token" }, ...candidates(run, pos));
  const minusPick = el("select", { "data-testid": "attribution-token-b" }, el("option", { value: "", text: "nothing" }), ...candidates(run, pos));
  if (ctx.params.token && [...tokenPick.options].some((o) => o.value === ctx.params.token)) tokenPick.value = ctx.params.token;
  const chart = el("div", { class: "chart tool-chart", "data-testid": "attribution-heatmap" });
  const summary = el("p", { class: "legend", "data-testid": "attribution-summary" });
  body.replaceChildren(
    el("div", { class: "tool-controls" }, "Logit of ", tokenPick, " minus ", minusPick,
      el("span", { class: "muted", text: ` at position ${pos} ${showToken(run.tokens[pos].text)}` })),
    chart, summary);

  async function draw() {
    const params = new URLSearchParams({ position: pos, token: tokenPick.value });
    if (minusPick.value) params.set("token_b", minusPick.value);
    const a = await getJSON(`/api/runs/${encodeURIComponent(run.run_id)}/attribution?${params}`);
    const L = run.n_layers;
    const H = run.n_heads;
    const cols = [...Array.from({ length: H }, (_, h) => `head ${h}`), "attn bias", "MLP"];
    const z = Array.from({ length: L }, () => new Array(H + 2).fill(null));
    let embed = 0;
    let finalBias = 0;
    for (const t of a.terms) {
      if (t.kind === "head") z[t.layer][t.head] = t.value;
      else if (t.kind === "bias" && t.layer !== null) z[t.layer][H] = t.value;
      else if (t.kind === "mlp") z[t.layer][H + 1] = t.value;
      else if (t.kind === "embed") embed = t.value;
      else finalBias = t.value;
    }
    const m = symmetric(z.map((r) => r.filter((v) => v !== null)));
    const what = a.token_b ? `logit(${showToken(a.token.token)}) − logit(${showToken(a.token_b.token)})` : `logit(${showToken(a.token.token)})`;
    await plot(chart, [{ type: "heatmap", z, x: cols, y: Array.from({ length: L }, (_, i) => `layer ${i}`),
      colorscale: DIVERGING, zmin: -m, zmax: m, xgap: 1, ygap: 1,
      hovertemplate: "%{y} · %{x}: %{z:.3f}<extra></extra>", colorbar: { title: { text: "logit" } } }],
    { title: { text: plotlyText(`direct contributions to ${what}`), font: { size: 12 } }, yaxis: { autorange: "reversed" } });
    chart.dataset.sum = String(a.terms.reduce((s, t) => s + t.value, 0));
    chart.dataset.logit = String(a.logit);
    chart.dataset.error = String(a.error);
    summary.textContent = `${what} = ${fmt(a.logit, 3)} = embeddings ${fmt(embed, 3)} + heads + biases + MLPs + final norm shift ` +
      `${fmt(finalBias, 3)} (float residue ${a.error.toExponential(1)}). The final norm's scale at this position is frozen, so ` +
      "the terms add up. Click a head to select it." + (a.final_transform ? ` Note: ${a.final_transform}.` : "");
  }
  await draw();
  chart.on("plotly_click", (ev) => {
    const pt = ev.points[0];
    const head = pt.pointIndex[1];
    if (head < run.n_heads) ctx.selectHead(pt.pointIndex[0], head);
  });
  tokenPick.addEventListener("change", () => draw().catch((e) => ctx.error(e.message)));
  minusPick.addEventListener("change", () => draw().catch((e) => ctx.error(e.message)));
}
