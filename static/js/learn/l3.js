// 3. Token IDs are indices: the tokenization table, and k vs k ± 1 vs real neighbours.
import { el, fmt, showToken } from "../dom.js";
import { getJSON } from "../api.js";
import { plot, label } from "./charts.js";
import { short } from "../views/focus.js";

export async function render(body, ctx) {
  const { run, t } = ctx;
  const table = el("table", { "data-testid": "l3-table" },
    el("thead", {}, el("tr", {}, ...["#", "token", "id", "chars"].map((h) => el("th", { text: h })))),
    el("tbody", {}, ...run.tokens.map((x) => el("tr", {},
      el("td", { text: String(x.index) }), el("td", { class: "mono", text: showToken(x.text) }),
      el("td", { text: String(x.id) }), el("td", { text: `${x.start}–${x.end}` })))));
  const idBox = el("input", { type: "number", min: 0, max: ctx.model.vocab_size - 1, value: run.tokens[Math.min(1, run.tokens.length - 1)].id, "data-testid": "l3-id" });
  const chart = el("div", { class: "chart tall", "data-testid": "l3-chart" });
  const note = el("p", { class: "muted" });
  body.replaceChildren(el("div", { class: "scroll" }, table), el("div", {}, el("label", {}, `${t("l3.id")} `, idBox), chart, note));
  async function draw() {
    const e = await getJSON(`/api/models/${encodeURIComponent(run.model)}/embedding?id=${Number(idBox.value)}&top=8`);
    const items = [...e.adjacent.map((a) => ({ ...a, kind: "id ± 1" })), ...e.neighbours.map((a) => ({ ...a, kind: "nearest" }))];
    await plot(chart, [{
      type: "bar", x: items.map((a) => `${a.id} ${label(short(a.token, 10))}`), y: items.map((a) => a.cos),
      marker: { color: items.map((a) => (a.kind === "nearest" ? "#08306b" : "#e6550d")) },
    }], { yaxis: { title: { text: `cosine with id ${e.id} ${label(e.token)}` }, range: [-0.3, 1] },
          shapes: [{ type: "line", xref: "paper", x0: 0, x1: 1, y0: e.random_mean, y1: e.random_mean, line: { dash: "dot", color: "#777" } }] });
    note.textContent = `Orange: ids ${e.adjacent.map((a) => a.id).join(" and ")} (next to ${e.id} in number only): cosine ${e.adjacent.map((a) => fmt(a.cos, 2)).join(", ")}. ` +
      `Blue: the real nearest neighbours. Dotted: random pairs average ${fmt(e.random_mean, 2)} ± ${fmt(e.random_std, 2)}.`;
  }
  idBox.addEventListener("change", () => draw().catch((e) => ctx.error(e.message)));
  await draw();
  ctx.link(3, {});
}
