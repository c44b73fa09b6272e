// 4. Embedding: the selected token's row of E as a strip, and its nearest neighbours.
import { el, fmt, showToken } from "../dom.js";
import { getJSON } from "../api.js";
import { plot, label } from "./charts.js";

export async function render(body, ctx) {
  const { run } = ctx;
  const pick = el("select", { "data-testid": "l4-token" }, ...run.tokens.map((x, i) => el("option", { value: x.id, text: `${i} ${showToken(x.text)} (id ${x.id})` })));
  const strip = el("div", { class: "chart", "data-testid": "l4-strip" });
  const list = el("ol", { "data-testid": "l4-neighbours" });
  body.replaceChildren(el("div", { class: "controls" }, pick), strip, list);
  async function draw() {
    const e = await getJSON(`/api/models/${encodeURIComponent(run.model)}/embedding?id=${pick.value}&top=10`);
    await plot(strip, [{ type: "heatmap", z: [e.vector], colorscale: "RdBu", zmid: 0, showscale: true,
      hovertemplate: "dim %{x}: %{z:.3f}<extra></extra>" }],
      { title: { text: `E[${e.id}] ${label(e.token)}: ${e.vector.length} numbers (d_model), ‖x‖ = ${fmt(e.norm, 2)}`, font: { size: 12 } },
        yaxis: { visible: false }, xaxis: { title: { text: "dimension" } }, margin: { l: 10, r: 10, t: 30, b: 40 } });
    list.replaceChildren(...e.neighbours.map((n) => el("li", { class: "mono", text: `${showToken(n.token)}  id ${n.id}  cos ${fmt(n.cos, 3)}` })));
  }
  pick.setAttribute("aria-label", "token");
  pick.addEventListener("change", () => draw().catch((e) => ctx.error(e.message)));
  await draw();
  ctx.link(4, {});
}
