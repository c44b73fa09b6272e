// 7. Encoder vs decoder: the same sentence through both bundled models.
import { el } from "../dom.js";
import { getAttentionBin, postJSON } from "../api.js";
import { drawHeatmap } from "../views/heatmap.js";

export async function render(body, ctx) {
  const { t, models, text } = ctx;
  const enc = models.find((m) => !m.causal);
  const dec = models.find((m) => m.causal && m.default) || models.find((m) => m.causal);
  const left = el("div", { class: "chart tall", "data-testid": "l7-encoder" });
  const right = el("div", { class: "chart tall", "data-testid": "l7-decoder" });
  body.replaceChildren(left, right);
  if (!enc || !dec) {
    body.replaceChildren(el("p", { class: "muted", text: "This server has no encoder configured beside its decoder." }));
    return;
  }
  const [re, rd] = await Promise.all([enc, dec].map((m) => postJSON("/api/runs", { text, model: m.name, top_k: 1 })));
  const [se, sd] = await Promise.all([getAttentionBin(re.run_id, 0, 0), getAttentionBin(rd.run_id, 0, 0)]);
  await drawHeatmap(left, se, re.tokens, { title: `${t("l7.enc")} · ${enc.name} layer 0 head 0` });
  await drawHeatmap(right, sd, rd.tokens, { title: `${t("l7.dec")} · ${dec.name} layer 0 head 0` });
  ctx.link(7, { model: enc.name, layer: 0, head: 0 });
}
