// Activation patching: copy each activation of a clean prompt into a corrupted one and see
// how much of logit(answer) − logit(wrong) comes back (1 = all of it, 0 = none).
import { postJSON } from "../api.js";
import { el, fmt, plotlyText, showToken } from "../dom.js";
import { DIVERGING, plot, tokenTicks } from "./common.js";

const EXAMPLE = {
  clean: "When Mary and John went to the store, John gave a drink to",
  corrupted: "When Mary and John went to the store, Mary gave a drink to",
  answer: " Mary",
  wrong: " John",
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
  const go = el("button", { type: "button", "data-testid": "patch-run", text: "Patch" });
  const summary = el("p", { class: "legend", "data-testid": "patch-summary" });
  const charts = el("div", { class: "patch-charts", "data-testid": "patch-heatmap" });
  const resid = el("div", { class: "chart tool-chart", "data-testid": "patch-resid" });
  const attn = el("div", { class: "chart tool-chart", "data-testid": "patch-attn" });
  const mlp = el("div", { class: "chart tool-chart", "data-testid": "patch-mlp" });
  const heads = el("div", { class: "chart tool-chart", "data-testid": "patch-heads" });
  charts.append(resid, attn, mlp, heads);
  body.replaceChildren(
    el("div", { class: "patch-form" },
      el("label", {}, "clean ", clean), el("label", {}, "corrupted ", corrupted),
      el("label", {}, "answer ", answer), el("label", {}, "wrong ", wrong), go),
    el("p", { class: "legend", text: "Same token count; answer and wrong are one token each (mind the leading space). " +
      "Each cell: (patched − corrupted) / (clean − corrupted) of logit(answer) − logit(wrong) at the last position." }),
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
      const layers = Array.from({ length: L }, (_, l) => `layer ${l}`);
      await heatmap(resid, res.resid, xs, ["embed", ...layers.map((_, l) => `after block ${l}`)], "residual stream (stage × position)", axis);
      await heatmap(attn, res.attn_out, xs, layers, "attention output (layer × position)", axis);
      await heatmap(mlp, res.mlp_out, xs, layers, "MLP output (layer × position)", axis);
      await heatmap(heads, res.heads, res.heads[0].map((_, h) => `head ${h}`), layers, "each head's output at every position (layer × head)");
      heads.on("plotly_click", (ev) => ctx.selectHead(ev.points[0].pointIndex[0], ev.points[0].pointIndex[1]));
      charts.dataset.stages = String(res.resid.length);
      charts.dataset.positions = String(tokens.length);
      summary.textContent = `${res.model}: logit(${showToken(res.answer.token)}) − logit(${showToken(res.wrong.token)}) at position ` +
        `${res.position} is ${fmt(res.clean.metric, 3)} on the clean prompt and ${fmt(res.corrupted.metric, 3)} on the corrupted one; ` +
        `the prompts first differ at position ${res.first_difference} (${showToken(tokens[res.first_difference].text)}). ${res.forwards} batched forwards.`;
    } catch (err) {
      ctx.error(err.message);
    } finally {
      go.disabled = false;
    }
  }
  go.addEventListener("click", run);
  await run(); // the URL's pair, or the example
}
