// Activation patching: copy each activation of a clean prompt into a corrupted one and see
// how much of logit(answer) − logit(wrong) comes back (1 = all of it, 0 = none).
import { getJSON, postJSON } from "../api.js";
import { el, fmt, isAbort, plotlyText, showToken } from "../dom.js";
import { DIVERGING, longRun, tokenTicks } from "./common.js";
import { plot } from "../chart.js";
import { t } from "../i18n.js";

// The default pair comes from the server (GET /api/models/{name}/patch-example): the first of a few
// candidates the model separates, by one cheap forward — IOI on SmolLM2 (+6.1 / −5.5), the copied
// sentence below on the bundled model (+0.43 / −0.25; its induction head, layer 4 head 0, restores
// the most). It runs by itself only when cheap (AUTO_TFLOP); otherwise the form waits for Run.
const AUTO_TFLOP = 0.2; // attnscope-tiny's default pair: 0.03 TFLOP, seconds; SmolLM2's: 2.2, half a minute
const MIN_GAP = 0.5; // model/tools/patching.py's MIN_GAP: a smaller |clean − corrupted| is not normalised by
const EXAMPLE = { // until the server's example arrives, or where it fails
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
  const hint = el("p", { class: "legend", "data-testid": "patch-hint", hidden: "" });
  const gapWarn = el("p", { class: "warn", "data-testid": "patch-gap-warning", hidden: "" });
  const progress = longRun("patch-progress");
  body.replaceChildren(
    el("div", { class: "patch-form" },
      el("label", {}, t("patch.clean"), clean), el("label", {}, t("patch.corrupted"), corrupted),
      el("label", {}, t("patch.answer"), answer), el("label", {}, t("patch.wrong"), wrong), go),
    ctx.alert, hint, progress.box,
    el("p", { class: "legend", text: t("patch.help") }),
    summary, gapWarn, charts);

  let example = null; // the server's example for this model: its pair, metrics and cost
  const fromUrl = ["clean", "corrupted", "answer", "wrong"].some((k) => ctx.params[k] != null);
  try {
    example = await getJSON(`/api/models/${encodeURIComponent(ctx.run.model)}/patch-example`);
    if (!fromUrl) for (const [k, input] of [["clean", clean], ["corrupted", corrupted], ["answer", answer], ["wrong", wrong]]) input.value = example[k];
  } catch (err) {
    ctx.error(err);
  }
  const isExample = () => example && clean.value === example.clean && corrupted.value === example.corrupted
    && answer.value === example.answer && wrong.value === example.wrong;

  async function run() {
    go.disabled = true;
    hint.hidden = true;
    ctx.error("");
    const req = { clean: clean.value, corrupted: corrupted.value, answer: answer.value, wrong: wrong.value };
    if (ctx.run) req.model = ctx.run.model;
    ctx.setParams(req);
    const signal = progress.start(isExample() ? example.seconds : 0);
    try {
      const res = await postJSON("/api/patch", req, { signal });
      const gap = res.clean.metric - res.corrupted.metric;
      const small = Math.abs(gap) < MIN_GAP;
      gapWarn.textContent = small ? t("patch.small_gap", { clean: fmt(res.clean.metric, 3), corrupted: fmt(res.corrupted.metric, 3), min: MIN_GAP })
        : res.clean.metric <= res.corrupted.metric ? t("patch.backwards", { clean: fmt(res.clean.metric, 3), corrupted: fmt(res.corrupted.metric, 3) }) : "";
      gapWarn.hidden = !gapWarn.textContent;
      charts.hidden = small; // maps normalised by noise mean nothing: not drawn
      charts.dataset.normalised = small ? "0" : "1";
      const tokens = res.clean.tokens;
      summary.textContent = t("patch.summary", { model: res.model, answer: showToken(res.answer.token), wrong: showToken(res.wrong.token),
        pos: res.position, clean: fmt(res.clean.metric, 3), corrupted: fmt(res.corrupted.metric, 3), diff: res.first_difference,
        token: showToken(tokens[res.first_difference].text), n: res.forwards });
      if (small) return;
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
      if (isAbort(err)) summary.textContent = t("patch.cancelled");
      else ctx.error(err);
    } finally {
      progress.stop();
      go.disabled = false;
    }
  }
  go.addEventListener("click", run);
  // the URL's pair or the example: run now where patching it is cheap, else say what Run will cost
  if (example && (example.tflop <= AUTO_TFLOP)) {
    await run();
  } else if (example) {
    hint.textContent = t("patch.not_started", { model: example.model, forwards: example.forwards, tflop: fmt(example.tflop, 1), s: fmt(example.seconds, 0) });
    hint.hidden = false;
  } else {
    await run();
  }
}
