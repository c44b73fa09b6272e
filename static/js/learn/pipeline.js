// 8. The decoder-only pipeline with live shapes, and the logit lens over a window of
// positions that moves (readable at any prompt length).
import { el, showToken } from "../dom.js";
import { getJSON } from "../api.js";
import { embedStage, tokenAxis } from "./charts.js";
import { figure, label, plot } from "../chart.js";
import { SCALE } from "../views/colour.js";

export async function render(body, ctx) {
  const { run, model: m, t } = ctx;
  const n = run.tokens.length;
  const flow = el("div", { class: "flow", "data-testid": "pipeline-flow" });
  const lensDiv = figure("pipeline-lens", "chart tall");
  const slider = el("input", { type: "range", min: 0, max: 0, step: 1, value: 0, "data-testid": "pipeline-window" });
  const where = el("output", { "data-testid": "pipeline-where" });
  const sliderLabel = el("span");
  const lensNote = el("p", { class: "muted" });
  body.replaceChildren(flow, el("div", { class: "controls" }, sliderLabel, slider, where), el("div", { class: "wide" }, lensDiv.box), el("div", { class: "wide" }, lensNote));
  const lens = await getJSON(`/api/runs/${run.run_id}/logit-lens?top_k=1`);
  // as many positions as fit at ~56 px each (at least 6, at most 24)
  const windowSize = () => Math.max(1, Math.min(n, 24, Math.max(6, Math.floor(((lensDiv.clientWidth || 600) - 160) / 56))));
  let size = windowSize();
  slider.max = String(Math.max(0, n - size));
  slider.value = slider.max; // the end of the prompt first: where the prediction is made

  function paintFlow() {
    const stages = [
      [t("pipeline.s.ids"), `${n}`], [t("pipeline.s.embed"), `${n} × ${m.d_model}`], [t("pipeline.s.blocks", { L: m.n_layers }), `${n} × ${m.d_model}`],
      [t("pipeline.s.final"), `${n} × ${m.d_model}`], [t("pipeline.s.head"), `${m.d_model} × ${m.vocab_size}`], [t("pipeline.s.logits"), `${n} × ${m.vocab_size}`],
      [t("pipeline.s.softmax"), `${n} × ${m.vocab_size}`],
    ];
    flow.replaceChildren();
    stages.forEach(([name, shape], i) => {
      if (i) flow.append(el("span", { class: "arrow", text: "→" }));
      flow.append(el("div", { class: "stage" }, el("b", { text: name }), el("span", { text: shape })));
    });
  }

  async function paintLens() {
    const start = Number(slider.value);
    const end = Math.min(n, start + size);
    const x = Array.from({ length: end - start }, (_, i) => start + i);
    const stage = (l) => (l.layer < 0 ? embedStage(t, m) : t("common.block", { i: l.layer }));
    const z = lens.layers.map((l) => x.map((p) => l.positions[p].top[0].prob));
    const text = lens.layers.map((l) => x.map((p) => label(l.positions[p].top[0].token)));
    where.textContent = t("pipeline.where", { a: start, b: end - 1, n });
    await plot(lensDiv, [{ type: "heatmap", x, z, text, texttemplate: "%{text}", textfont: { size: 10 }, colorscale: SCALE, zmin: 0, zmax: 1,
      colorbar: { title: { text: "p" }, thickness: 10 },
      hovertemplate: t("pipeline.hover") + "<extra></extra>", y: lens.layers.map(stage) }],
    { title: { text: t("pipeline.title", { a: start, b: end - 1 }), font: { size: 12 }, x: 0, xanchor: "left" },
      xaxis: tokenAxis(run.tokens.slice(start, end).map((tk) => tk.text), 40, start), yaxis: { automargin: true }, margin: { l: 70, r: 10, t: 8, b: 70 } });
    lensDiv.dataset.start = String(start);
    lensDiv.dataset.layers = String(lens.layers.length);
    const lastStage = lens.layers.at(-1);
    const p = end - 1;
    lensNote.textContent = t("pipeline.note", { p, token: showToken(run.tokens[p].text), top: showToken(lastStage.positions[p].top[0].token), prob: lastStage.positions[p].top[0].prob.toFixed(2) });
    ctx.link({ pos: p });
  }
  slider.addEventListener("input", () => paintLens().catch((e) => ctx.error(e)));
  new ResizeObserver(() => {
    const s = windowSize();
    if (s === size || !lensDiv.isConnected) return;
    size = s;
    slider.max = String(Math.max(0, n - size));
    if (Number(slider.value) > Number(slider.max)) slider.value = slider.max;
    paintLens().catch((e) => ctx.error(e));
  }).observe(lensDiv);
  await ctx.paint(async () => {
    sliderLabel.textContent = t("pipeline.window");
    paintFlow();
    await paintLens();
  });
}
