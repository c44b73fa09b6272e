// 5. d_model and heads: the model's anatomy and the live tensor shapes.
import { el } from "../dom.js";
import { getJSON } from "../api.js";
import { plot } from "./charts.js";

const M = (x) => (x >= 1e6 ? `${(x / 1e6).toFixed(2)}M` : x >= 1e3 ? `${(x / 1e3).toFixed(1)}k` : String(x));

export async function render(body, ctx) {
  const { run, model: m } = ctx;
  const a = await getJSON(`/api/models/${encodeURIComponent(run.model)}/anatomy`);
  const n = run.tokens.length;
  const facts = [
    ["vocabulary V", m.vocab_size], ["d_model", m.d_model], ["heads h", m.n_heads], ["d_head", m.d_head],
    ["h × d_head", `${m.n_heads} × ${m.d_head} = ${m.n_heads * m.d_head}`], ["K/V heads", m.n_kv_heads],
    ["layers", m.n_layers], ["MLP width", m.d_mlp], ["parameters", M(a.total)],
    ["token embedding", `${M(a.token_embedding)} (${m.vocab_size} × ${m.d_model})`],
    ["position embedding", M(a.position_embedding)], ["LM head", a.lm_head_tied ? "tied to the token embedding" : M(a.lm_head)],
  ];
  const shapes = [
    ["input X", `${n} × ${m.d_model}`], ["one head's Q, K, V", `${n} × ${m.d_head} each`],
    ["one head's scores QKᵀ", `${n} × ${n}`], ["all heads' outputs", `${m.n_heads} × (${n} × ${m.d_head})`],
    ["concatenated", `${n} × ${m.n_heads * m.d_head} = ${n} × ${m.d_model}`], ["block output", `${n} × ${m.d_model}`],
  ];
  const table = (rows, id) => el("table", { "data-testid": id }, el("tbody", {}, ...rows.map(([k, v]) => el("tr", {}, el("th", { text: k }), el("td", { class: "mono", text: String(v) })))));
  const chart = el("div", { class: "chart", "data-testid": "l5-chart" });
  body.replaceChildren(table(facts, "l5-facts"), table(shapes, "l5-shapes"), chart);
  const layers = a.per_layer.map((l) => `block ${l.layer}`);
  await plot(chart, [
    { type: "bar", name: "attention", x: layers, y: a.per_layer.map((l) => l.attention) },
    { type: "bar", name: "MLP", x: layers, y: a.per_layer.map((l) => l.mlp) },
    { type: "bar", name: "norms", x: layers, y: a.per_layer.map((l) => l.norms) },
  ], { barmode: "stack", yaxis: { title: { text: "parameters" } }, legend: { orientation: "h", y: 1.2 } });
  ctx.link(5, {});
}
