// 7. Encoder vs decoder: the same sentence through both bundled models.
import { el } from "../dom.js";
import { getAttentionBin, postJSON } from "../api.js";
import { drawHeatmap } from "../views/heatmap.js";
import { headName } from "./charts.js";

export async function render(body, ctx) {
  const { t, models, text } = ctx;
  const enc = models.find((m) => !m.causal);
  const dec = models.find((m) => m.causal && m.default) || models.find((m) => m.causal);
  const left = el("div", { class: "chart tall", "data-testid": "l7-encoder" });
  const right = el("div", { class: "chart tall", "data-testid": "l7-decoder" });
  if (!enc || !dec) {
    const msg = el("p", { class: "muted", "data-testid": "l7-missing" });
    body.replaceChildren(msg);
    await ctx.paint(() => { msg.textContent = t("l7.missing"); });
    return;
  }
  body.replaceChildren(left, right);
  const [re, rd] = await Promise.all([enc, dec].map((m) => postJSON("/api/runs", { text, model: m.name, top_k: 1 })));
  const [se, sd] = await Promise.all([getAttentionBin(re.run_id, 0, 0), getAttentionBin(rd.run_id, 0, 0)]);
  ctx.link({ model: enc.name, layer: 0, head: 0, pos: re.tokens.length - 1 });
  await ctx.paint(async () => {
    await drawHeatmap(left, se, re.tokens, { title: `${t("l7.enc")} · ${enc.name} · ${headName(t, 0, 0)}` });
    await drawHeatmap(right, sd, rd.tokens, { title: `${t("l7.dec")} · ${dec.name} · ${headName(t, 0, 0)}` });
  });
}
