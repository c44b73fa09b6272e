// Activation patching: copy each activation of a clean prompt into a corrupted one and see
// how much of logit(answer) − logit(wrong) comes back (1 = all of it, 0 = none).
import { postJSON } from "../api.js";
import { el, fmt, plotlyText, showToken } from "../dom.js";
import { DIVERGING, tokenTicks } from "./common.js";
import { plot } from "../chart.js";
import { t } from "../i18n.js";

// The default pair: a sentence seen once, then again up to its last word, so that copying
// (an induction head) is what tells the two answers apart. The bundled model prefers " city"
// on the clean prompt and " country" on the corrupted one (logit difference 0.43 and -0.25),
// and its induction head, layer 4 head 0, restores the most; the classic IOI pair ("When Mary
// and John went to the store, John gave a drink to") needs a model that can do IOI.
const EXAMPLE = {
  clean: "My friend John lives in the city. My friend John lives in the",
  corrupted: "My friend John lives in the country. My friend John lives in the",
  answer: " city",
  wrong: " country",
};

function heatmap(div, z, x, y, title, extra = {}) {
  return plot(div, [{ type: "heatmap", z, x, y, colorscale: DIVERGING, zmin: -1, zmax: 1, xgap: 1, ygap: 1,
    hovertemplate: "%{y} · %{x}: %{z:.3f}<extra></extra>" }],
  { title: { text: plotlyText(title), font: { size: 12 } }, yaxis: { autorange: "reversed" }, ...extra });
}

export async function render(body, ctx) {
  const field = (name, testid) => {
    const input = el("input", { type: "text", class: "patch-input", "data-testid": testid, spellcheck: "false" });
    input.value = ctx.params[name] ?? EXAMPLE[name];
    return input;
  };
  const clean = field("clean", "patch-clean");
  const corrupted = field("corrupted", "patch-corrupted");
  const answer = field("answer", "patch-answer");
  const wrong = field("wrong", "patch-wrong");
  const go = el("button", { type: "button", "data-testid": "patch-run", text: t("patch.run") });
  const summary = el("p", { class: "legend tool-result", "data-testid": "patch-summary" });
  const charts = el("div", { class: "patch-charts", "data-testid": "patch-heatmap" });
  const resid = el("div", { class: "chart tool-chart", "data-testid": "patch-resid" });
  const attn = el("div", { class: "chart tool-chart", "data-testid": "patch-attn" });
  const mlp = el("div", { class: "chart tool-chart", "data-testid": "patch-mlp" });
  const heads = el("div", { class: "chart tool-chart", "data-testid": "patch-heads" });
  charts.append(resid, attn, mlp, heads);
  body.replaceChildren(
    el("div", { class: "patch-form" },
      el("label", {}, t("patch.clean"), clean), el("label", {}, t("patch.corrupted"), corrupted),
      el("label", {}, t("patch.answer"), answer), el("label", {}, t("patch.wrong"), wrong), go),
    ctx.alert,
    el("p", { class: "legend", text: t("patch.help") }),
    summary, charts);

  async function run() {
    go.disabled = true;
    ctx.error("");
    const req = { clean: clean.value, corrupted: corrupted.value, answer: answer.value, wrong: wrong.value };
    if (ctx.run) req.model = ctx.run.model;
    ctx.setParams(req);
    try {
      const res = await postJSON("/api/patch", req);
      const tokens = res.clean.tokens;
      const xs = tokens.map((_, i) => i);
      const ticks = tokenTicks(tokens);
      const axis = { xaxis: ticks };
      const L = res.attn_out.length;
      const layers = Array.from({ length: L }, (_, l) => t("common.layer", { i: l }));
      await heatmap(resid, res.resid, xs, [t("tool.embed"), ...layers.map((_, l) => t("patch.after_block", { i: l }))], t("patch.t_resid"), axis);
      await heatmap(attn, res.attn_out, xs, layers, t("patch.t_attn"), axis);
      await heatmap(mlp, res.mlp_out, xs, layers, t("patch.t_mlp"), axis);
      await heatmap(heads, res.heads, res.heads[0].map((_, h) => t("common.head", { i: h })), layers, t("patch.t_heads"));
      heads.on("plotly_click", (ev) => ctx.selectHead(ev.points[0].pointIndex[0], ev.points[0].pointIndex[1]));
      charts.dataset.stages = String(res.resid.length);
      charts.dataset.positions = String(tokens.length);
      summary.textContent = t("patch.summary", { model: res.model, answer: showToken(res.answer.token), wrong: showToken(res.wrong.token),
        pos: res.position, clean: fmt(res.clean.metric, 3), corrupted: fmt(res.corrupted.metric, 3), diff: res.first_difference,
        token: showToken(tokens[res.first_difference].text), n: res.forwards });
    } catch (err) {
      ctx.error(err);
    } finally {
      go.disabled = false;
    }
  }
  go.addEventListener("click", run);
  await run(); // the URL's pair, or the example
}
