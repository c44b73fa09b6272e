// 9. The residual stream: norms, change per layer, and attention vs FFN for one token.
import { el, showToken } from "../dom.js";
import { getJSON } from "../api.js";
import { legendAbove, plot } from "./charts.js";

export async function render(body, ctx) {
  const { run, t } = ctx;
  const res = await getJSON(`/api/runs/${run.run_id}/residual`);
  const pick = el("select", { "data-testid": "l9-token" }, ...run.tokens.map((x, i) => el("option", { value: i, text: `${i} ${showToken(x.text)}` })));
  pick.value = String(run.tokens.length - 1);
  const norms = el("div", { class: "chart", "data-testid": "l9-norms" });
  const parts = el("div", { class: "chart", "data-testid": "l9-parts" });
  body.replaceChildren(el("div", { class: "controls" }, `${t("l9.token")} `, pick), norms, parts);
  const stages = ["embed", ...res.layers.map((l) => `block ${l.layer}`)];
  async function draw() {
    const i = Number(pick.value);
    await plot(norms, [
      { type: "scatter", mode: "lines+markers", name: "‖hidden state‖", x: stages, y: [res.embed_norm[i], ...res.layers.map((l) => l.resid_norm[i])] },
      { type: "scatter", mode: "lines+markers", name: "cosine to the previous layer", x: stages.slice(1), y: res.layers.map((l) => l.cos_prev[i]), yaxis: "y2" },
    ], { yaxis: { title: { text: "norm" }, rangemode: "tozero" },
         yaxis2: { overlaying: "y", side: "right", range: [Math.min(0, ...res.layers.map((l) => l.cos_prev[i])) - 0.05, 1.05], title: { text: "cosine" }, showgrid: false },
         ...legendAbove(2), margin: { l: 50, r: 55, t: 64, b: 40 } });
    const layers = res.layers.map((l) => `block ${l.layer}`);
    await plot(parts, [
      { type: "bar", name: "attention adds (communication between tokens)", x: layers, y: res.layers.map((l) => l.attn_norm[i]) },
      { type: "bar", name: "FFN adds (computation within the position)", x: layers, y: res.layers.map((l) => l.mlp_norm[i]) },
    ], { barmode: "stack", yaxis: { title: { text: "‖added vector‖" } }, ...legendAbove(2) });
  }
  pick.setAttribute("aria-label", t("l9.token"));
  pick.addEventListener("change", () => draw().catch((e) => ctx.error(e.message)));
  await draw();
  ctx.link(9, { pos: Number(pick.value) });
}
