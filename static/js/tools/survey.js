// The corpus survey ("Corpus"): what each head does across a corpus, not on this prompt. Upload a corpus
// file (plain text, documents between blank lines, or JSON Lines) and follow its progress, or open a survey
// file (`attnscope survey FILE`); then every head's corpus mean of a score as a layer × head map (hover:
// mean ± spread over how many windows), the selected head's scores and its strongest examples, and a
// switch that badges and labels the explorer's head map from the corpus instead of the prompt.
// Token text is untrusted: set as text, never HTML.
import { check, getJSON, request } from "../api.js";
import { el, fmt, plotlyText, showToken } from "../dom.js";
import { plot } from "../chart.js";
import { t } from "../i18n.js";
import { ui } from "../state.js";
import { SCALE } from "../views/colour.js";

const FIELDS = ["entropy", "prev_token", "first_token", "max", "induction", "self_attention"];
const POLL_MS = 500;

/**
 * @typedef {{mean: number|null, std: number|null, count: number}} Stat
 * @typedef {{document: number, offset: number, query: number, key: number, weight: number, start: number,
 *   tokens: string[], key_start: number, key_tokens: string[]}} SurveyExample
 * @typedef {{id: string, status: string, model: string, source: string|null, documents: number, sequences: number,
 *   tokens: number, fraction: number|null, tokens_per_s: number, error: string|null, error_code: string|null,
 *   survey: object|null}} SurveyStatus
 */

/** The survey's per-head means as the head map's score objects (its badges and labels read these). */
export function gridScores(survey) {
  return {
    heads: survey.heads.map((h) => ({ layer: h.layer, head: h.head, entropy: h.entropy.mean, prev_token: h.prev_token.mean,
      first_token: h.first_token.mean, max: h.max.mean, induction: h.induction.mean })),
    rows: Math.max(2, Math.round(survey.tokens / Math.max(1, survey.sequences))),
    documents: survey.documents, tokens: survey.tokens, model: survey.model, n_layers: survey.n_layers, n_heads: survey.n_heads,
  };
}

function progressText(s) {
  const share = s.fraction !== null ? t("sv.progress.share", { p: fmt(100 * s.fraction, 0) }) : "";
  return share + t("sv.progress", { docs: s.documents.toLocaleString(), tokens: s.tokens.toLocaleString(), rate: fmt(s.tokens_per_s, 0) });
}

/** One example as a line of tokens: the query marked, the key marked where it lies in the same span. */
function exampleLine(e) {
  const line = el("li", { class: "sv-example", "data-testid": "sv-example" });
  line.append(el("span", { class: "muted", text: t("sv.example.where", { doc: e.document, q: e.offset + e.query, k: e.offset + e.key, w: fmt(e.weight, 3) }) + " " }));
  const span = (tokens, start, mark) => {
    const out = el("span", { class: "mono" });
    tokens.forEach((tok, i) => {
      const at = start + i;
      const cls = at === e.query && mark !== "key" ? "sv-q" : at === e.key ? "sv-k" : "";
      out.append(el("span", { class: cls, text: showToken(tok) }));
    });
    return out;
  };
  if (e.key >= e.start) line.append(span(e.tokens, e.start, "both"));
  else line.append(span(e.key_tokens, e.key_start, "key"), el("span", { class: "muted", text: " … " }), span(e.tokens, e.start, "query"));
  return line;
}

export async function render(body, ctx) {
  const { layer, head } = ctx;
  const corpusPick = el("input", { type: "file", id: "survey-file", "data-testid": "survey-file", accept: ".txt,.text,.md,.jsonl,.ndjson,text/plain" });
  const windowPick = el("input", { type: "number", id: "survey-window", "data-testid": "survey-window", min: "2", step: "1", value: "512" });
  const start = el("button", { type: "button", "data-testid": "survey-start", text: t("sv.start") });
  const openPick = el("input", { type: "file", id: "survey-open", "data-testid": "survey-open", accept: ".safetensors" });
  const bar = el("progress", { max: "1", value: "0", "data-testid": "survey-progress" });
  const barText = el("span", { "data-testid": "survey-progress-text" });
  const stop = el("button", { type: "button", "data-testid": "survey-stop", text: t("sv.stop") });
  const progressLine = el("p", { class: "legend", role: "status", hidden: "" }, bar, " ", barText, " ", stop);
  const summary = el("p", { class: "legend", "data-testid": "survey-summary" });
  const explain = el("p", { class: "legend muted", text: t("sv.explain") });
  const fieldPick = el("select", { id: "survey-field", "data-testid": "survey-field", "aria-label": t("sv.field_aria") },
    ...FIELDS.map((f) => el("option", { value: f, text: t(`sv.f.${f}`) })));
  fieldPick.value = ctx.params.field && FIELDS.includes(ctx.params.field) ? ctx.params.field : "induction";
  const onGrid = el("input", { type: "checkbox", id: "survey-on-grid", "data-testid": "survey-on-grid" });
  onGrid.checked = ui.surveyOnGrid;
  const mapChart = el("div", { class: "chart tool-chart", "data-testid": "survey-map" });
  const headBox = el("div", { class: "sv-head", "data-testid": "survey-head" });
  const results = el("div", { hidden: "" },
    el("div", { class: "tool-controls" }, el("label", { for: fieldPick.id, text: t("sv.colour_by") }), fieldPick,
      el("label", { for: onGrid.id }, onGrid, " ", t("sv.on_grid"))), mapChart, headBox);
  body.replaceChildren(explain,
    el("div", { class: "tool-controls" }, el("label", { for: corpusPick.id, text: t("sv.corpus") }), corpusPick,
      el("label", { for: windowPick.id, text: t("sv.window") }), windowPick, start),
    el("div", { class: "tool-controls" }, el("label", { for: openPick.id, text: t("sv.open") }), openPick),
    progressLine, summary, results);

  const show = async (status) => {
    ui.survey = status;
    const running = status.status === "running";
    progressLine.hidden = !running;
    bar.value = status.fraction ?? 0;
    barText.textContent = progressText(status);
    if (status.status === "failed") ctx.error(status.error || "");
    if (status.status !== "done" || !status.survey) {
      summary.textContent = status.status === "stopped" ? t("sv.stopped") : "";
      results.hidden = true;
      return;
    }
    const s = status.survey;
    summary.replaceChildren(t("sv.summary", { source: s.source || "", model: s.model, docs: s.documents.toLocaleString(),
      windows: s.sequences.toLocaleString(), tokens: s.tokens.toLocaleString(), window: s.max_tokens }) + " ",
      el("a", { href: `/api/surveys/${encodeURIComponent(status.id)}/file`, download: `${status.id}.survey.safetensors`,
        "data-testid": "survey-download", text: t("sv.download") }));
    results.hidden = false;
    await drawMap(s);
    drawHead(s);
  };

  async function drawMap(s) {
    const f = fieldPick.value;
    const z = Array.from({ length: s.n_layers }, () => new Array(s.n_heads).fill(null));
    const hover = Array.from({ length: s.n_layers }, () => new Array(s.n_heads).fill(""));
    for (const h of s.heads) {
      const st = h[f];
      z[h.layer][h.head] = st.mean;
      hover[h.layer][h.head] = st.mean === null ? t("sv.undefined") : t("sv.hover", { mean: fmt(st.mean, 3), std: fmt(st.std ?? 0, 3), n: st.count });
    }
    const narrow = (mapChart.clientWidth || 600) < 520; // a phone: the colour bar without its title, thinner
    await plot(mapChart, [{ type: "heatmap", z, text: hover, colorscale: SCALE, xgap: 1, ygap: 1,
      x: Array.from({ length: s.n_heads }, (_, i) => t("common.head", { i })), y: Array.from({ length: s.n_layers }, (_, i) => t("common.layer", { i })),
      hovertemplate: "%{y} · %{x}: %{text}<extra></extra>",
      colorbar: narrow ? { thickness: 10 } : { title: { text: plotlyText(t(`sv.f.${f}`)) } } }],
    { title: { text: plotlyText(t("sv.map_title", { field: t(`sv.f.${f}`), docs: s.documents })), font: { size: 12 } }, yaxis: { autorange: "reversed" } });
    mapChart.dataset.field = f;
    mapChart.dataset.heads = String(s.heads.length);
    if (!mapChart.dataset.wired) { // once: plotly keeps the chart's listeners across redraws
      mapChart.dataset.wired = "1";
      mapChart.on("plotly_click", (ev) => {
        const pt = ev.points[0];
        ctx.selectHead(pt.pointIndex[0], pt.pointIndex[1]);
      });
    }
  }

  function drawHead(s) {
    const h = s.heads.find((x) => x.layer === layer && x.head === head);
    if (!h) return;
    const rows = FIELDS.map((f) => el("tr", {}, el("th", { scope: "row", text: t(`sv.f.${f}`) }),
      el("td", { text: h[f].mean === null ? "—" : fmt(h[f].mean, 3) }), el("td", { text: h[f].std === null ? "—" : fmt(h[f].std, 3) }),
      el("td", { text: String(h[f].count) })));
    rows.push(el("tr", {}, el("th", { scope: "row", text: t("sv.probe") }),
      el("td", { text: h.induction_probe === null ? "—" : fmt(h.induction_probe, 3) }), el("td", { text: "" }), el("td", { text: "" })));
    headBox.replaceChildren(el("h4", { text: t("sv.head_title", { layer, head }) }),
      el("table", { class: "sv-table", "data-testid": "survey-head-table" },
        el("thead", {}, el("tr", {}, el("th", { text: "" }), el("th", { text: t("sv.mean") }), el("th", { text: t("sv.std") }), el("th", { text: t("sv.count") }))),
        el("tbody", {}, ...rows)),
      el("p", { class: "legend", text: t("sv.examples", { k: h.examples.length }) }),
      el("ol", { class: "sv-examples", "data-testid": "survey-examples" }, ...h.examples.map(exampleLine)));
  }

  const poll = async (id) => {
    clearTimeout(ui.surveyPoll);
    const status = await getJSON(`/api/surveys/${encodeURIComponent(id)}`);
    if (!body.isConnected) return; // the view was closed; the survey runs on, shown when it is opened again
    await show(status);
    if (status.status === "running") ui.surveyPoll = setTimeout(() => poll(id).catch((e) => ctx.error(e)), POLL_MS);
    else if (status.status === "done" && ui.surveyOnGrid) ctx.setCorpus(gridScores(status.survey));
  };

  start.addEventListener("click", async () => {
    ctx.error("");
    const file = corpusPick.files && corpusPick.files[0];
    if (!file) return ctx.error(t("sv.pick_first"));
    const params = new URLSearchParams({ name: file.name, max_tokens: windowPick.value || "512" });
    try {
      const r = await request(`/api/surveys?${params}`, { method: "POST", headers: { "content-type": "application/octet-stream" }, body: file });
      const status = await (await check(r)).json();
      await show(status);
      await poll(status.id);
    } catch (err) { ctx.error(err); }
  });
  openPick.addEventListener("change", async () => {
    ctx.error("");
    const file = openPick.files && openPick.files[0];
    if (!file) return;
    try {
      const r = await request("/api/surveys/open", { method: "POST", headers: { "content-type": "application/octet-stream" }, body: file });
      await show(await (await check(r)).json());
      if (ui.surveyOnGrid) ctx.setCorpus(gridScores(ui.survey.survey));
    } catch (err) { ctx.error(err); }
  });
  stop.addEventListener("click", () => {
    if (ui.survey) request(`/api/surveys/${encodeURIComponent(ui.survey.id)}/stop`, { method: "POST" }).catch((e) => ctx.error(e));
  });
  fieldPick.addEventListener("change", () => {
    ctx.setParams({ field: fieldPick.value });
    if (ui.survey && ui.survey.survey) drawMap(ui.survey.survey).catch((e) => ctx.error(e));
  });
  onGrid.addEventListener("change", () => {
    ui.surveyOnGrid = onGrid.checked;
    ctx.setCorpus(onGrid.checked && ui.survey && ui.survey.survey ? gridScores(ui.survey.survey) : null);
  });
  if (ui.survey) {
    if (ui.survey.status === "running") await poll(ui.survey.id);
    else await show(ui.survey);
  }
}
