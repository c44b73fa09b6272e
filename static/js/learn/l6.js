// 6. Position information: the position table, and the same words in another order.
import { el, fmt } from "../dom.js";
import { getAttentionBin, getJSON, postJSON } from "../api.js";
import { drawHeatmap } from "../views/heatmap.js";
import { plot, label } from "./charts.js";

export async function render(body, ctx) {
  const { run, t } = ctx;
  const pos = await getJSON(`/api/models/${encodeURIComponent(run.model)}/positions?count=64`);
  const table = el("div", { class: "chart tall", "data-testid": "l6-positions" });
  const aBox = el("input", { value: "dog bites man", "data-testid": "l6-a", "aria-label": t("l6.a") });
  const bBox = el("input", { value: "man bites dog", "data-testid": "l6-b", "aria-label": t("l6.b") });
  const go = el("button", { type: "button", text: "compare" });
  const heatA = el("div", { class: "chart tall", "data-testid": "l6-heat-a" });
  const heatB = el("div", { class: "chart tall", "data-testid": "l6-heat-b" });
  const cos = el("div", { class: "chart", "data-testid": "l6-cos" });
  const preds = el("p", { class: "muted mono", "data-testid": "l6-preds" });
  body.replaceChildren(table, el("div", { class: "controls" }, `${t("l6.a")} `, aBox, `${t("l6.b")} `, bBox, go), heatA, heatB, cos, preds);
  if (pos.kind === "learned") {
    await plot(table, [{ type: "heatmap", z: pos.matrix, colorscale: "RdBu", zmid: 0, hovertemplate: "position %{y}, dim %{x}: %{z:.3f}<extra></extra>" }],
      { title: { text: `learned position table: ${pos.count} positions × ${pos.d_model} dims`, font: { size: 12 } },
        xaxis: { title: { text: "dimension" } }, yaxis: { title: { text: "position" }, autorange: "reversed" } });
  } else if (pos.kind === "rotary") {
    await plot(table, [{ type: "heatmap", z: pos.angles, colorscale: "RdBu", zmid: 0 }],
      { title: { text: `rotary: cos(position × frequency), ${pos.rotary_dims} rotated dims, θ = ${pos.theta}`, font: { size: 12 } },
        yaxis: { autorange: "reversed", title: { text: "position" } }, xaxis: { title: { text: "frequency pair" } } });
  }
  async function compare() {
    const [a, b] = await Promise.all([aBox.value, bBox.value].map((text) => postJSON("/api/runs", { text, model: run.model, top_k: 3 })));
    const layer = 0, head = run.heads.reduce((x, h) => (h.layer === 0 && h.prev_token > x.prev_token ? h : x), run.heads[0]).head;
    const [sa, sb] = await Promise.all([getAttentionBin(a.run_id, layer, head), getAttentionBin(b.run_id, layer, head)]);
    await drawHeatmap(heatA, sa, a.tokens, { title: `A · layer ${layer} head ${head}` });
    await drawHeatmap(heatB, sb, b.tokens, { title: `B · layer ${layer} head ${head}` });
    const c = await getJSON(`/api/compare?a=${a.run_id}&b=${b.run_id}`);
    await plot(cos, [{ type: "bar", x: c.tokens.map((x) => `${x.a} ${label(x.token)}`), y: c.tokens.map((x) => x.cos), marker: { color: "#2171b5" } }],
      { title: { text: t("l6.cos"), font: { size: 12 } }, margin: { l: 40, r: 10, t: 36, b: 60 }, yaxis: { range: [Math.min(0, ...c.tokens.map((x) => x.cos)), 1] } });
    const last = (r) => r.predictions.at(-1).top.map((p) => `${p.token.trim() || p.token} ${fmt(p.prob, 2)}`).join(", ");
    preds.textContent = `A "${aBox.value}" → ${last(a)}\nB "${bBox.value}" → ${last(b)}`;
  }
  go.addEventListener("click", () => compare().catch((e) => ctx.error(e.message)));
  await compare();
  ctx.link(6, {});
}
