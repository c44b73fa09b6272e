// 4. Embedding: the selected token's row of E as a strip, and its nearest neighbours.
import { el, fmt, showToken } from "../dom.js";
import { getJSON } from "../api.js";
import { figure, label, plot } from "../chart.js";
import { sampledNote } from "./ids.js";

export async function render(body, ctx) {
  const { run, t } = ctx;
  const pick = el("select", { "data-testid": "embedding-token" });
  const strip = figure("embedding-strip", "chart short");
  const listTitle = el("p", { class: "muted" });
  const list = el("ol", { "data-testid": "embedding-neighbours" });
  const warn = el("p", { class: "warn", hidden: "" });
  body.replaceChildren(el("div", { class: "controls" }, pick), el("div", { class: "wide" }, strip.box), el("div", {}, warn, listTitle, list));
  const options = () => {
    const keep = pick.value;
    pick.replaceChildren(...run.tokens.map((x, i) => el("option", { value: x.id, text: t("embedding.option", { i, token: showToken(x.text), id: x.id }) })));
    if (keep) pick.value = keep;
  };
  options();
  const longest = run.tokens.reduce((a, x) => (x.text.trim().length > a.text.trim().length ? x : a), run.tokens[0]);
  pick.value = String(longest.id);
  let e = null;

  async function paint() {
    await plot(strip, [{ type: "heatmap", z: [e.vector], colorscale: "RdBu", zmid: 0, showscale: true,
      hovertemplate: t("embedding.hover") + "<extra></extra>" }],
    { title: { text: t("embedding.title", { id: e.id, token: label(e.token), d: e.vector.length, norm: fmt(e.norm, 2) }), font: { size: 12 }, x: 0, xanchor: "left" },
      yaxis: { visible: false }, xaxis: { title: { text: t("common.dimension") } }, margin: { l: 10, r: 10, t: 8, b: 40 } });
    listTitle.textContent = t("embedding.neighbours");
    list.replaceChildren(...e.neighbours.map((nb) => el("li", { class: "mono", text: t("embedding.neighbour", { token: showToken(nb.token), id: nb.id, cos: fmt(nb.cos, 3) }) })));
    warn.hidden = !e.untrained;
    warn.textContent = e.untrained ? `${t("ids.untrained", { k: e.id, count: e.untrained_count })} ${sampledNote(e, ctx.model.vocab_size, t)}`.trim() : "";
  }
  async function load() {
    e = await getJSON(`/api/models/${encodeURIComponent(run.model)}/embedding?id=${pick.value}&top=10`);
    ctx.link({ pos: Math.max(0, run.tokens.findIndex((x) => String(x.id) === pick.value)) });
  }
  pick.addEventListener("change", () => load().then(paint).catch((err) => ctx.error(err)));
  await load();
  await ctx.paint(async () => {
    options();
    await paint();
  });
}
