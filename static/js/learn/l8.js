// 8. The decoder-only pipeline with live shapes, and the logit lens.
import { el } from "../dom.js";
import { getJSON } from "../api.js";
import { plot, tokenAxis, label } from "./charts.js";
import { SCALE } from "../views/colour.js";

export async function render(body, ctx) {
  const { run, model: m } = ctx;
  const n = run.tokens.length;
  const stages = [
    ["Token IDs", `${n}`], ["Embedding", `${n} × ${m.d_model}`], [`${m.n_layers} blocks`, `${n} × ${m.d_model}`],
    ["final hidden", `${n} × ${m.d_model}`], ["LM head", `${m.d_model} × ${m.vocab_size}`], ["logits", `${n} × ${m.vocab_size}`],
    ["softmax → probabilities", `${n} × ${m.vocab_size}`],
  ];
  const flow = el("div", { class: "flow", "data-testid": "l8-flow" });
  stages.forEach(([name, shape], i) => {
    if (i) flow.append(el("span", { class: "arrow", text: "→" }));
    flow.append(el("div", { class: "stage" }, el("b", { text: name }), el("span", { text: shape })));
  });
  const lensDiv = el("div", { class: "chart tall", "data-testid": "l8-lens" });
  body.replaceChildren(flow, lensDiv);
  const lens = await getJSON(`/api/runs/${run.run_id}/logit-lens?top_k=1`);
  const shown = Math.min(n, 48);
  const z = lens.layers.map((l) => l.positions.slice(0, shown).map((p) => p.top[0].prob));
  const text = lens.layers.map((l) => l.positions.slice(0, shown).map((p) => label(p.top[0].token)));
  await plot(lensDiv, [{ type: "heatmap", z, text, texttemplate: "%{text}", textfont: { size: 9 }, colorscale: SCALE, zmin: 0, zmax: 1,
    hovertemplate: "%{y} · position %{x}: %{text} (p=%{z:.3f})<extra></extra>", y: lens.layers.map((l) => l.label) }],
    { title: { text: `logit lens: top token and its probability<br>after each block (first ${shown} positions)`, font: { size: 12 } },
      xaxis: tokenAxis(run.tokens.slice(0, shown).map((x) => x.text)), margin: { l: 70, r: 10, t: 48, b: 70 } });
  lensDiv.dataset.layers = String(lens.layers.length);
  ctx.link(8, {});
}
