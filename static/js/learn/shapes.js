// 5. d_model and heads: the model's anatomy and the live tensor shapes.
import { el } from "../dom.js";
import { getJSON } from "../api.js";
import { figure, plot } from "../chart.js";

const M = (x) => (x >= 1e6 ? `${(x / 1e6).toFixed(2)}M` : x >= 1e3 ? `${(x / 1e3).toFixed(1)}k` : String(x));

export async function render(body, ctx) {
  const { run, model: m, t } = ctx;
  const a = await getJSON(`/api/models/${encodeURIComponent(run.model)}/anatomy`);
  const n = run.tokens.length;
  const factsTable = el("table", { "data-testid": "shapes-facts" });
  const shapesTable = el("table", { "data-testid": "shapes-shapes" });
  const chart = figure("shapes-chart", "chart tall");
  body.replaceChildren(factsTable, shapesTable, chart.box);
  const fill = (table, rows) => table.replaceChildren(el("tbody", {}, ...rows.map(([k, v]) => el("tr", {}, el("th", { text: t(`shapes.${k}`) }), el("td", { class: "mono", text: String(v) })))));

  await ctx.paint(async () => {
    fill(factsTable, [
      ["vocab", m.vocab_size], ["d_model", m.d_model], ["heads", m.n_heads], ["d_head", m.d_head],
      ["h_x_dh", `${m.n_heads} × ${m.d_head} = ${m.n_heads * m.d_head}`], ["kv_heads", m.n_kv_heads],
      ["layers", m.n_layers], ["mlp", m.d_mlp], ["params", M(a.total)],
      ["tok_emb", `${M(a.token_embedding)} (${m.vocab_size} × ${m.d_model})`],
      ["pos_emb", M(a.position_embedding)], ["lm_head", a.lm_head_tied ? t("shapes.tied") : M(a.lm_head)],
    ]);
    fill(shapesTable, [
      ["x", `${n} × ${m.d_model}`], ["qkv", t("shapes.each", { shape: `${n} × ${m.d_head}` })],
      ["scores", `${n} × ${n}`], ["heads_out", `${m.n_heads} × (${n} × ${m.d_head})`],
      ["concat", `${n} × ${m.n_heads * m.d_head} = ${n} × ${m.d_model}`], ["block_out", `${n} × ${m.d_model}`],
    ]);
    // blocks on a numbered axis: "block 0".."block 35" as tick labels overlap on a phone
    const x = a.per_layer.map((l) => l.layer);
    const names = a.per_layer.map((l) => t("common.block", { i: l.layer }));
    const bar = (part, key) => ({ type: "bar", name: t(key), x, y: a.per_layer.map((l) => l[part]), customdata: names,
      hovertemplate: "%{customdata}: %{y:,}<extra>%{fullData.name}</extra>" });
    await plot(chart, [bar("attention", "shapes.part.attention"), bar("mlp", "shapes.part.mlp"), bar("norms", "shapes.part.norms")], {
      barmode: "stack", yaxis: { title: { text: t("shapes.y") } },
      xaxis: { title: { text: t("shapes.blocks") }, automargin: true, tickangle: 0, tickmode: x.length <= 12 ? "linear" : "auto", dtick: 1 },
      legend: { orientation: "h", x: 0, y: 1.15 }, margin: { t: 40 } }); // the legend above: every block's label fits
  });
  ctx.link({});
}
