// 9. The residual stream: norms, change per stage, and attention vs FFN for one token — with
// the numbers said plainly: every block adds to the stream, and block 0 adds far more than
// the embedding holds, which is why the direction turns there.
import { el, fmt, showToken } from "../dom.js";
import { getJSON } from "../api.js";
import { embedStage } from "./charts.js";
import { figure, plot } from "../chart.js";
import { sentences as joinSentences } from "../i18n.js";

export async function render(body, ctx) {
  const { run, model, t } = ctx;
  const res = await getJSON(`/api/runs/${run.run_id}/residual`);
  const pick = el("select", { "data-testid": "residual-token" });
  const pickLabel = el("span");
  const norms = figure("residual-norms");
  const parts = figure("residual-parts");
  const note = el("p", { class: "facts", "data-testid": "residual-note" });
  body.replaceChildren(el("div", { class: "controls" }, pickLabel, pick), norms.box, parts.box, el("div", { class: "wide" }, note));
  const options = () => {
    const keep = pick.value;
    pick.replaceChildren(...run.tokens.map((x, i) => el("option", { value: i, text: `${i} ${showToken(x.text)}` })));
    pick.value = keep || String(run.tokens.length - 1);
  };
  options();

  async function paint() {
    const i = Number(pick.value);
    pickLabel.textContent = t("residual.token");
    const blocks = res.layers.map((l) => t("common.block", { i: l.layer }));
    const stages = [embedStage(t, model), ...blocks];
    const normY = [res.embed_norm[i], ...res.layers.map((l) => l.resid_norm[i])];
    await plot(norms, [
      { type: "scatter", mode: "lines+markers", name: t("residual.norm"), x: stages, y: normY },
      { type: "scatter", mode: "lines+markers", name: t("residual.cos"), x: blocks, y: res.layers.map((l) => l.cos_prev[i]), yaxis: "y2" },
    ], { yaxis: { title: { text: t("residual.norm_y") }, rangemode: "tozero" },
      yaxis2: { overlaying: "y", side: "right", range: [Math.min(0, ...res.layers.map((l) => l.cos_prev[i])) - 0.05, 1.05], title: { text: t("residual.cos_y") }, automargin: true, dtick: 0.25 },
      xaxis: { type: "category" }, title: { text: t("residual.norms_title") }, margin: { l: 56, r: 56, t: 16, b: 40 } });
    await plot(parts, [
      { type: "bar", name: t("residual.attn"), x: blocks, y: res.layers.map((l) => l.attn_norm[i]) },
      { type: "bar", name: t("residual.ffn"), x: blocks, y: res.layers.map((l) => l.mlp_norm[i]) },
    ], { barmode: "group", yaxis: { title: { text: t("residual.added_y") } }, title: { text: t("residual.parts_title") }, margin: { t: 16 } });
    const e = res.embed_norm[i];
    const b0 = res.layers[0];
    const later = res.layers.slice(1);
    const sentences = [t("residual.note.first", {
      what: stages[0], e: fmt(e, 2), a: fmt(b0.attn_norm[i], 1), f: fmt(b0.mlp_norm[i], 1), r: fmt(b0.resid_norm[i], 1),
      ratio: fmt(b0.resid_norm[i] / Math.max(e, 1e-9), 0), c: fmt(b0.cos_prev[i], 2),
    })];
    if (later.length) {
      const cs = later.map((l) => l.cos_prev[i]);
      sentences.push(t("residual.note.later", { min: fmt(Math.min(...cs), 2), max: fmt(Math.max(...cs), 2), last: fmt(res.layers.at(-1).resid_norm[i], 1) }));
    }
    sentences.push(t("residual.note.roles"));
    note.textContent = joinSentences(sentences);
    ctx.link({ pos: i });
  }
  pick.addEventListener("change", () => paint().catch((e) => ctx.error(e)));
  await ctx.paint(async () => {
    options();
    await paint();
  });
}
