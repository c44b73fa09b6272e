// 7. Encoder vs decoder: the same sentence through both bundled models.
import { el } from "../dom.js";
import { getAttentionBin, postJSON } from "../api.js";
import { drawHeatmap } from "../views/heatmap.js";
import { headName } from "./charts.js";

export async function render(body, ctx) {
  const { t, models, text } = ctx;
  const enc = models.find((m) => !m.causal);
  const dec = models.find((m) => m.causal && m.default) || models.find((m) => m.causal);
  const left = el("div", { class: "chart tall", "data-testid": "encoders-encoder" });
  const right = el("div", { class: "chart tall", "data-testid": "encoders-decoder" });
  if (!enc || !dec) {
    const msg = el("p", { class: "muted", "data-testid": "encoders-missing" });
    body.replaceChildren(msg);
    await ctx.paint(() => { msg.textContent = t("encoders.missing"); });
    return;
  }
  const unk = el("p", { class: "muted", "data-testid": "encoders-unk", hidden: "" });
  body.replaceChildren(left, right, el("div", { class: "wide" }, unk));
  // each model on its own: a prompt one of them refuses (the encoder's 512 positions) is said in
  // this lesson, and the other one is still drawn
  const load = async (m) => {
    const r = await postJSON("/api/runs", { text, model: m.name, top_k: 1 });
    return { r, scores: await getAttentionBin(r.run_id, 0, 0) };
  };
  const [ge, gd] = await Promise.allSettled([load(enc), load(dec)]);
  const refused = [ge, gd].find((g) => g.status === "rejected");
  const sides = [[ge, left, "encoders.enc", enc], [gd, right, "encoders.dec", dec]].filter(([g, div]) => {
    div.hidden = g.status !== "fulfilled";
    return !div.hidden;
  });
  if (!sides.length) throw refused.reason;
  if (refused) {
    const [key, model] = refused === ge ? ["encoders.refused_enc", enc.name] : ["encoders.refused_dec", dec.name];
    ctx.error(refused.reason, { key, vars: { model } });
  }
  const shown = ge.status === "fulfilled" ? { model: enc.name, r: ge.value.r } : { model: dec.name, r: gd.value.r };
  ctx.link({ model: shown.model, layer: 0, head: 0, pos: shown.r.tokens.length - 1 });
  // characters the encoder's vocabulary lacks become [UNK]: said, with the characters it stands for
  const unknown = ge.status === "fulfilled" ? ge.value.r.tokens.filter((x) => x.text === "[UNK]" && x.end > x.start) : [];
  const chars = [...new Set(unknown.map((x) => text.slice(x.start, x.end)))].join(" ");
  await ctx.paint(async () => {
    for (const [g, div, key, m] of sides) await drawHeatmap(div, g.value.scores, g.value.r.tokens, { title: `${t(key)} · ${m.name} · ${headName(t, 0, 0)}` });
    unk.hidden = !unknown.length;
    unk.textContent = unknown.length ? t("encoders.unk", { model: enc.name, chars, unk: "[UNK]" }) : ""; // the token as the encoder spells it
  });
}
