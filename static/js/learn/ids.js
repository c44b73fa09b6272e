// 3. Token IDs are indices: the tokenization table; k against k ± 1 and 2k (related in number
// only) and the real nearest neighbours, against random pairs of trained rows; untrained rows
// (tokens training never saw) detected and said so.
import { el, fmt, showToken } from "../dom.js";
import { getJSON } from "../api.js";
import { figure, label, plot } from "../chart.js";
import { short } from "../views/focus.js";
import { sentences } from "../i18n.js";

const embedding = (model, id, top = 8) => getJSON(`/api/models/${encodeURIComponent(model)}/embedding?id=${id}&top=${top}`);

// The default: a trained token of the prompt whose 2k is in the vocabulary, the longest
// (most word-like) first.
async function defaultId(run, vocab) {
  const seen = new Set();
  const candidates = [...run.tokens].filter((x) => x.end > x.start && !seen.has(x.id) && seen.add(x.id))
    .sort((a, b) => (2 * b.id < vocab) - (2 * a.id < vocab) || b.text.trim().length - a.text.trim().length);
  for (const x of candidates.slice(0, 6)) {
    const e = await embedding(run.model, x.id);
    if (!e.untrained) return e;
  }
  return embedding(run.model, (candidates[0] || run.tokens[0]).id);
}

// What a large vocabulary's embedding view skips (the V x V sweep for untrained rows): said, or "".
export function sampledNote(e, vocab, t) {
  return e.untrained_examined < vocab ? t("ids.sampled", { examined: e.untrained_examined, vocab, count: e.untrained_count }) : "";
}

export async function render(body, ctx) {
  const { run, t } = ctx;
  const table = el("table", { "data-testid": "ids-table" });
  const idBox = el("input", { type: "number", min: 0, max: ctx.model.vocab_size - 1, "data-testid": "ids-id" });
  const idLabel = el("span");
  const chart = figure("ids-chart", "chart tall");
  chart.dataset.tokenX = "1"; // its categories are token text (tests/i18n_check.py)
  const note = el("p", { class: "muted", "data-testid": "ids-note" });
  const warn = el("p", { class: "warn", "data-testid": "ids-untrained", hidden: "" });
  const sampled = el("p", { class: "muted", "data-testid": "ids-sampled", hidden: "" });
  // a refused ID is said beside the box it was typed in (and cleared by the next good one)
  body.replaceChildren(el("div", { class: "scroll" }, table), el("div", { class: "controls" }, el("label", {}, idLabel, " ", idBox), ctx.errorBox()),
    el("div", { class: "wide" }, warn, chart.box, note, sampled));
  let e = await defaultId(run, ctx.model.vocab_size);
  idBox.value = String(e.id);

  function paintTable() {
    table.replaceChildren(
      el("thead", {}, el("tr", {}, ...["pos", "token", "id", "chars"].map((k) => el("th", { text: t(`ids.col.${k}`) })))),
      el("tbody", {}, ...run.tokens.map((x) => el("tr", {},
        el("td", { text: String(x.index) }), el("td", { class: "mono", text: showToken(x.text) }),
        el("td", { text: String(x.id) }), el("td", { text: `${x.start}–${x.end}` })))));
    idLabel.textContent = t("ids.id");
  }

  async function paintChart() {
    const groups = [
      ["adjacent", e.adjacent, "#e6550d"], ["double", e.double, "#fd8d3c"], ["nearest", e.neighbours, "#08306b"],
    ];
    const traces = groups.filter(([, rows]) => rows.length).map(([kind, rows, colour]) => ({
      type: "bar", name: t(`ids.kind.${kind}`), x: rows.map((a) => `${a.id} ${label(short(a.token, 10))}`), y: rows.map((a) => a.cos),
      marker: { color: rows.map((a) => (a.untrained ? "#bdbdbd" : colour)), line: { color: colour, width: 1.5 } },
      customdata: rows.map((a) => (a.untrained ? t("ids.untrained_mark") : "")),
      hovertemplate: `%{x}: ${t("ids.cos_hover")} %{y:.3f} %{customdata}<extra></extra>`,
    }));
    // a cosine lies in [-1, 1]: the band of random pairs (mean ± 2σ) is cut there
    const lo = Math.max(-1, e.random_mean - 2 * e.random_std), hi = Math.min(1, e.random_mean + 2 * e.random_std);
    traces.push({ type: "scatter", mode: "lines", name: t("ids.random", { mean: fmt(e.random_mean, 2), std: fmt(e.random_std, 2) }),
      x: [null], y: [null], line: { color: "#777", dash: "dot" } });
    const all = [...e.adjacent, ...e.double, ...e.neighbours].map((a) => a.cos);
    await plot(chart, traces, {
      title: { text: t("ids.title", { id: e.id, token: e.token }) },
      yaxis: { title: { text: t("ids.y") }, range: [Math.min(-0.3, ...all) - 0.05, 1.05] },
      // slanted labels need ~70 px a bar; a narrower chart (a phone) sets them upright, so none overlap
      xaxis: { tickangle: (chart.clientWidth || 600) / Math.max(1, all.length) < 70 ? -90 : -40, type: "category" },
      barmode: "group", bargap: 0.25, margin: { t: 16 },
      shapes: [
        { type: "rect", xref: "paper", x0: 0, x1: 1, y0: lo, y1: hi, fillcolor: "rgba(120,120,120,0.12)", line: { width: 0 }, layer: "below" },
        { type: "line", xref: "paper", x0: 0, x1: 1, y0: e.random_mean, y1: e.random_mean, line: { dash: "dot", color: "#777" } },
      ] });
    chart.dataset.id = String(e.id);
    const inBand = (c) => c >= lo && c <= hi;
    const near = e.neighbours.filter((a) => !a.untrained);
    const adj = e.adjacent.map((a) => t("ids.pair", { id: a.id, token: showToken(a.token), cos: fmt(a.cos, 2) })).join(t("common.and"));
    const dbl = e.double.length ? t("ids.double", { k: e.id, id: e.double[0].id, token: showToken(e.double[0].token), cos: fmt(e.double[0].cos, 2) }) : t("ids.no_double", { k: e.id });
    const verdict = [...e.adjacent, ...e.double].every((a) => inBand(a.cos)) ? "ids.verdict.band" : "ids.verdict.outside";
    const last = ctx.model.vocab_size - 1;
    // the ends of the vocabulary have one neighbour in number: say so instead of leaving it out
    const edge = e.id === 0 ? t("ids.first") : e.id === last ? t("ids.last", { k: last }) : "";
    note.textContent = sentences([t("ids.note", { k: e.id, token: showToken(e.token), adj, dbl }), edge,
      t(verdict, { lo: fmt(lo, 2), hi: fmt(hi, 2), mean: fmt(e.random_mean, 2) }),
      // a nearest row inside the random band is not "close": the sentence says so instead
      near.length ? t(near[0].cos > hi ? "ids.nearest" : "ids.nearest.in_band", { token: showToken(near[0].token), cos: fmt(near[0].cos, 2), mean: fmt(e.random_mean, 2) }) : ""]);
    warn.hidden = !e.untrained;
    warn.textContent = e.untrained ? t("ids.untrained", { k: e.id, count: e.untrained_count }) : "";
    sampled.textContent = sampledNote(e, ctx.model.vocab_size, t);
    sampled.hidden = !sampled.textContent;
  }

  idBox.addEventListener("change", async () => {
    try {
      e = await embedding(run.model, Number(idBox.value));
      ctx.error("");
      await paintChart();
    } catch (err) {
      ctx.error(err);
    }
  });
  ctx.link({ pos: Math.max(0, run.tokens.findIndex((x) => x.id === e.id)) });
  await ctx.paint(async () => {
    paintTable();
    await paintChart();
  });
}
