// The explorer: analyse a prompt once, then look at it head by head and token by token. This is
// its controller: it wires the page's controls to the explorer's modules, each with one job:
//   explorer/errors.js     the one error box (showError), the stale-run and truncation notes
//   explorer/requests.js   the one request in flight (begin / latest / end), the busy line
//   explorer/zoom.js       zoom boxes, plotly zooms, a long run's tiled view
//   explorer/draw.js       the selected head's heatmap, focus row, readout, next-token chart
//   explorer/selection.js  cell, token and head selection; the head grid and the causal tools
//   explorer/timeline.js   the generate form's state and a recorded generation's timeline
//   explorer/export.js     PNG / SVG / JSON / safetensors exports
//   explorer/analyse.js    analyse, load a run, late scores, sparsity
//   explorer/runfiles.js   download a run's file, open one (picker, drop, run=ID), save as HTML
//   explorer/generate.js   generate and record, with the live view
import { $, el } from "./dom.js";
import { getJSON } from "./api.js";
import { state, set, fromURL, toURL, urlExtras } from "./state.js";
import { errorText, initLanguage, lang, onLanguage, t } from "./i18n.js";
import { repaintErrors, safely, report, showError } from "./explorer/errors.js";
import { onBusy, showBusy } from "./explorer/requests.js";
import { setPool, zoom } from "./explorer/zoom.js";
import { drawHead, drawNextSoon, wireWith } from "./explorer/draw.js";
import { heatmapKeys, selectHead, tools, wireHeatmap } from "./explorer/selection.js";
import { recount, repaintGenerateForm, showStep, updateGenerate } from "./explorer/timeline.js";
import { exportGrid, exportHeatmap, exportKept, exportRunJSON, exporting, showExportProblem } from "./explorer/export.js";
import { analyse, repaintRun, sortGrid, updateChatForm } from "./explorer/analyse.js";
import { continueGeneration, generateAndRecord } from "./explorer/generate.js";
import { linkedRun, openStored, repaintRunFiles, wireRunFiles } from "./explorer/runfiles.js";
import { isOffered, loadOffered, offeredOptions, setOffered } from "./explorer/offered.js";
import { watchFaint } from "./explorer/faint.js";

const DEFAULT_PROMPT = "I love artificial intelligence";

wireWith(wireHeatmap); // a drawn heatmap answers hover, clicks and zooms
onBusy(updateGenerate); // the generate button says why it cannot act while a request runs

// the model a shared link asked for when this server does not serve it (null: none, or resolved)
let unknownModel = null;
function showModelNote() {
  const note = $("#model-note");
  note.textContent = unknownModel ? t("x.model.unknown", { wanted: unknownModel, model: $("#model-picker").value }) : "";
  note.hidden = !unknownModel;
}

// Redraw every translated piece of the explorer in the current language, from what is loaded.
async function repaint(fillModels) {
  fillModels();
  showModelNote();
  repaintErrors();
  showBusy();
  repaintGenerateForm();
  showExportProblem();
  repaintRunFiles();
  tools.labels();
  if (!state.run) return;
  await repaintRun();
}

async function init() {
  const [{ models, available }] = await Promise.all([getJSON("/api/models"), initLanguage()]);
  set({ models });
  setOffered(available);
  tools.labels(); // built before the language was chosen
  const picker = $("#model-picker");
  const fillModels = () => {
    const keep = picker.value;
    picker.replaceChildren(...state.models.map((m) => el("option", { value: m.name, text: t("x.model.option", { name: m.name, family: m.causal ? m.family : t("x.model.encoder_family", { family: m.family }), dtype: m.dtype, device: m.device }) })),
      ...offeredOptions());
    if (keep) picker.value = keep;
  };
  fillModels();
  const dflt = models.find((m) => m.default);
  if (dflt) picker.value = dflt.name;
  urlExtras.push(() => ({ lang: lang() })); // the shareable URL keeps the language
  onLanguage(() => repaint(fillModels)); // every word of the explorer, without a reload

  $("#analyze").addEventListener("click", () => analyse());
  $("#prompt").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey) && !ev.target.readOnly) analyse(); // read-only: a saved file
  });
  for (const b of document.querySelectorAll(".example")) {
    b.addEventListener("click", () => { $("#prompt").value = b.dataset.example; analyse(); });
  }
  picker.addEventListener("change", async () => { // an offered model loads when picked, then is like the others
    const name = picker.value;
    if (!isOffered(name)) return;
    const loaded = await loadOffered(name);
    fillModels();
    picker.value = loaded ? name : (state.models.find((m) => m.default) || state.models[0]).name;
    updateGenerate();
    updateChatForm();
  });
  picker.addEventListener("change", updateGenerate);
  picker.addEventListener("change", updateChatForm);
  $("#chat-mode").addEventListener("change", updateChatForm);
  updateChatForm();
  $("#layer-picker").addEventListener("change", (ev) => selectHead(Number(ev.target.value), state.head));
  $("#head-picker").addEventListener("change", (ev) => selectHead(state.layer, Number(ev.target.value)));
  watchFaint(); // a view almost white on the linear scale says which scale shows it
  $("#colour-scale").addEventListener("change", safely((ev) => { set({ colour: ev.target.value }); return state.run && drawHead(); }));
  $("#grid-sort").addEventListener("change", safely((ev) => sortGrid(ev.target.value)));
  $("#temperature").addEventListener("input", (ev) => {
    const t = Number(ev.target.value);
    $("#temperature-value").textContent = t.toFixed(2);
    set({ temperature: t });
    drawNextSoon(60);
    toURL();
  });
  $("#export-png").addEventListener("click", exporting(() => exportHeatmap("png")));
  $("#export-svg").addEventListener("click", exporting(() => exportHeatmap("svg")));
  $("#grid-png").addEventListener("click", safely(() => exportGrid("png")));
  $("#grid-svg").addEventListener("click", safely(() => exportGrid("svg")));
  $("#generate").addEventListener("click", () => generateAndRecord());
  $("#gen-count").addEventListener("input", recount);
  $("#gen-continue").addEventListener("click", continueGeneration);
  $("#timeline").addEventListener("input", safely((ev) => showStep(Number(ev.target.value))));
  $("#zoom-apply").addEventListener("click", safely(zoom));
  for (const id of ["#zoom-q0", "#zoom-q1", "#zoom-k0", "#zoom-k1"]) {
    $(id).addEventListener("keydown", (ev) => { if (ev.key === "Enter") safely(zoom)(); });
  }
  $("#pool").addEventListener("change", safely((ev) => setPool(ev.target.value)));
  $("#zoom-reset").addEventListener("click", safely(() => {
    set({ zoom: null });
    $("#zoom-note").hidden = true;
    return state.run && drawHead();
  }));
  $("#heatmap").addEventListener("keydown", heatmapKeys);
  $("#export-json").addEventListener("click", exporting(exportRunJSON));
  $("#export-kept").addEventListener("click", exporting(exportKept));
  wireRunFiles(exporting);
  window.addEventListener("unhandledrejection", (ev) => { report(ev.reason); ev.preventDefault(); });
  updateGenerate();

  // a shared link reopens the same view; a first visit analyses the prefilled example at once
  const want = fromURL();
  const stored = linkedRun(); // an opened run file's id: the run itself, whatever its model
  if (want.model && models.some((m) => m.name === want.model)) picker.value = want.model;
  else if (want.model && !stored) { // a link to a model this server lacks: say so, rather than quietly show another
    unknownModel = want.model;
    showModelNote();
    picker.addEventListener("change", () => { unknownModel = null; showModelNote(); }, { once: true });
  }
  if (want.sort && [...$("#grid-sort").options].some((o) => o.value === want.sort)) set({ sort: want.sort });
  if (want.colour && [...$("#colour-scale").options].some((o) => o.value === want.colour)) set({ colour: want.colour });
  if (want.pool === "mean") set({ pool: "mean" });
  $("#pool").value = state.pool;
  if (want.temperature !== undefined && want.temperature >= 0.1 && want.temperature <= 3) set({ temperature: want.temperature });
  $("#grid-sort").value = state.sort;
  $("#colour-scale").value = state.colour;
  $("#temperature").value = String(state.temperature);
  $("#temperature-value").textContent = state.temperature.toFixed(2);
  $("#prompt").value = want.text || $("#prompt").value || DEFAULT_PROMPT; // keep what was typed while the page loaded
  updateGenerate();
  await (stored ? openStored(stored, want) : analyse(want));
}

function start() {
  init().catch((err) => showError(t("x.start_failed", { message: errorText(err) })));
}
// plotly.min.js is a deferred classic script; modules run after it
if (window.Plotly) start();
else window.addEventListener("load", start);
