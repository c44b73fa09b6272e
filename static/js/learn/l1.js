// 1. Attention aggregates context: weights vs what each source actually adds.
import { el, fmt } from "../dom.js";
import { getJSON } from "../api.js";
import { legendAbove, plot, tokenAxis } from "./charts.js";

export async function render(body, ctx) {
  const { run } = ctx;
  const best = run.heads.reduce((a, h) => (h.prev_token > a.prev_token ? h : a), run.heads[0]);
  const layerSel = el("select", { "data-testid": "l1-layer" }, ...Array.from({ length: run.n_layers }, (_, i) => el("option", { value: i, text: `layer ${i}` })));
  const headSel = el("select", { "data-testid": "l1-head" }, ...Array.from({ length: run.n_heads }, (_, i) => el("option", { value: i, text: `head ${i}` })));
  const posSel = el("select", { "data-testid": "l1-pos" }, ...run.tokens.map((t, i) => el("option", { value: i, text: `${i} ${t.text}` })));
  layerSel.value = best.layer; headSel.value = best.head; posSel.value = run.tokens.length - 1;
  const chart = el("div", { class: "chart tall", "data-testid": "l1-chart" });
  const note = el("p", { class: "muted" });
  body.replaceChildren(el("div", { class: "controls" }, layerSel, headSel, posSel), chart, note);
  async function draw() {
    const [layer, head, position] = [layerSel.value, headSel.value, posSel.value].map(Number);
    const c = await getJSON(`/api/runs/${run.run_id}/contributions?layer=${layer}&head=${head}&position=${position}`);
    const total = c.contributions.reduce((a, b) => a + b, 0) || 1;
    const share = c.contributions.map((v) => v / total);
    const tokens = run.tokens.slice(0, c.weights.length).map((t) => t.text);
    const x = tokens.map((_, i) => i);
    await plot(chart, [
      { type: "bar", name: "attention weight", x, y: c.weights, marker: { color: "#6baed6" } },
      { type: "bar", name: "share of what the head adds<br>(weight × ‖v W_O‖)", x, y: share, marker: { color: "#08306b" } },
    ], { barmode: "group", xaxis: { ...tokenAxis(tokens), automargin: true }, yaxis: { range: [0, 1.02] }, ...legendAbove(3) });
    const top = share.indexOf(Math.max(...share));
    note.textContent = `Largest contribution: token ${top} "${tokens[top]}" (${fmt(share[top], 2)} of the head's output at this position; its weight is ${fmt(c.weights[top], 2)}).`;
    ctx.link(1, { layer, head, pos: position });
  }
  for (const [s, what] of [[layerSel, "layer"], [headSel, "head"], [posSel, "token position"]]) {
    s.setAttribute("aria-label", what);
    s.addEventListener("change", () => draw().catch((e) => ctx.error(e.message)));
  }
  await draw();
}
