// Run files (issue 30): "Download run" saves the run as one file (format=attnscope), "Open run"
// (the file picker, or a file dropped anywhere on the page) stores such a file on this server and
// shows it as if it had been analysed, and "Save as HTML" says the size of the run's standalone page
// before it downloads it. An opened run keeps its id in the URL (run=…), so that a reload or a shared
// link opens it again (GET /api/runs/{id}); an id the server does not know says so and analyses the
// link's text instead. A file's name and its bytes are untrusted: only ever text, never markup.
import { $, isAbort } from "../dom.js";
import { ApiError, check, getJSON, request } from "../api.js";
import { state, toURL, urlExtras, ui } from "../state.js";
import { isEmbedded, search } from "../page.js";
import { lang, t } from "../i18n.js";
import { report, showCut, showError } from "./errors.js";
import { begin, end, latest } from "./requests.js";
import { hideStatus } from "./timeline.js";
import { NEW_RUN, analyse, loadRun } from "./analyse.js";
import { download } from "./export.js";

// an exported HTML file answers the page's requests from what it holds: it has no server to send a run to
const offline = Boolean(globalThis.ATTNSCOPE_EMBED && globalThis.ATTNSCOPE_EMBED.offline);

// the runs opened from a file or by their id: the URL names them by id (a run analysed here by its text)
const opened = new WeakSet();
urlExtras.push(() => (state.run && opened.has(state.run) ? { run: state.run.run_id } : {}));

const runURL = (run, tail = "") => `/api/runs/${encodeURIComponent(run.run_id)}${tail}`;

// the file name the server gives (Content-Disposition), without any path, else `fallback`
function fileName(r, fallback) {
  const m = /filename="?([^";]+)"?/i.exec(r.headers.get("content-disposition") || "");
  const name = m ? m[1].split(/[\\/]/).pop().trim() : "";
  return name || fallback;
}

// the file at `url` saved under the name the server gives it (else `fallback`)
async function saveFile(url, fallback) {
  const r = await check(await request(url));
  download(fileName(r, fallback), await r.blob());
}

// ---- Download run ---------------------------------------------------------------------------------

export async function downloadRun() {
  const run = state.run;
  if (!run) return;
  await saveFile(runURL(run, "/export?format=attnscope"), `attnscope-run-${run.run_id}.attnscope`);
}

// ---- Open run ---------------------------------------------------------------------------------------

// A run the server answered with (POST /api/runs/import, GET /api/runs/{id}), shown as an analysed one.
async function show(run, initial = {}) {
  opened.add(run);
  $("#prompt").value = run.text;
  const picker = $("#model-picker");
  if ([...picker.options].some((o) => o.value === run.model)) picker.value = run.model;
  await loadRun(run, initial);
  toURL();
  showOpened(); // whether its model is loaded here
}

// Store `file` (a File or Blob) on this server and show it; a refusal is said in the error box.
export async function openRunFile(file) {
  if (!file) return;
  showError("");
  const req = begin("analyse");
  try {
    // the file itself, read as it is sent; the notebook widget's frame posts its bytes on
    const body = isEmbedded() ? await file.arrayBuffer() : file;
    const r = await request("/api/runs/import", { method: "POST", headers: { "content-type": "application/octet-stream" },
                                                  body, signal: req.controller.signal });
    await check(r);
    const run = await r.json();
    if (!latest(req)) return;
    showCut(null);
    hideStatus();
    await show(run);
    ui.opened = { tokens: run.tokens.length, model: run.model }; // said until the next run
    showOpened();
  } catch (err) {
    if (latest(req)) {
      report(err);
      $("#error").scrollIntoView({ block: "nearest" }); // the button may be far below it (a phone)
    }
  } finally {
    end(req);
  }
}

// A link's run=ID: the stored run, else (an id this server does not know) the link's text, and why.
export async function openStored(runId, initial) {
  const req = begin("analyse");
  let run = null, failure = null;
  try {
    run = await getJSON(`/api/runs/${encodeURIComponent(runId)}`, { signal: req.controller.signal });
  } catch (err) {
    failure = err;
  } finally {
    end(req);
  }
  if (isAbort(failure)) return;
  if (run) {
    await show(run, initial);
    return;
  }
  await analyse(initial);
  // a link to a run this server does not keep (another server's, or one gone since): said in the
  // page's words, which a language switch redraws; anything else as the server said it
  const gone = failure && (failure.code === "run_not_found" || failure.code === "run_expired");
  const code = initial && initial.text ? "run_link_unknown" : "run_link_unknown_default"; // the link's text, or the example
  report(gone ? new ApiError(failure.status, "", code, { run_id: runId }) : failure);
}

// the run id a link asks for, or null
export const linkedRun = () => new URLSearchParams(search()).get("run") || null;

// Files dragged over the page: a hint while they hover, the first one opened on drop. Text dragged
// into the prompt is left to the browser.
function wireDrop() {
  const hint = $("#drop-hint");
  const carriesFile = (ev) => Boolean(ev.dataTransfer) && [...ev.dataTransfer.types].includes("Files");
  let depth = 0; // dragenter/dragleave pairs, one for every element crossed
  document.addEventListener("dragenter", (ev) => {
    if (!carriesFile(ev)) return;
    depth += 1;
    hint.hidden = false;
  });
  document.addEventListener("dragleave", (ev) => {
    if (!carriesFile(ev)) return;
    depth = Math.max(0, depth - 1);
    if (!depth) hint.hidden = true;
  });
  document.addEventListener("dragover", (ev) => {
    if (!carriesFile(ev)) return;
    ev.preventDefault(); // else the browser navigates to the dropped file
    ev.dataTransfer.dropEffect = "copy";
  });
  document.addEventListener("drop", (ev) => {
    if (!carriesFile(ev)) return;
    ev.preventDefault();
    depth = 0;
    hint.hidden = true;
    openRunFile(ev.dataTransfer.files[0]);
  });
}

// ---- Save as HTML -----------------------------------------------------------------------------------

const MB = 1 << 20;
const sizeText = (bytes) => (bytes >= MB / 10 ? `${(bytes / MB).toFixed(1)} MB` : `${Math.max(1, Math.round(bytes / 1024))} KB`);
const headNames = (list) => list.split(",").filter(Boolean).map((h) => `L${h.replace(".", "H")}`).join(", ");

// ui.htmlOffer (state.js): what the HTML file would hold, {run, heads, size: {bytes, exact_heads, overview_heads, every_head}}

function showOffer() {
  const box = $("#html-offer");
  box.hidden = !ui.htmlOffer;
  if (!ui.htmlOffer) return;
  const { bytes, exact_heads: exact, overview_heads: overview, every_head: all } = ui.htmlOffer.size;
  const size = sizeText(bytes);
  $("#html-offer-text").textContent = all ? t("x.run.html_all", { size })
    : exact ? t("x.run.html_some", { size, heads: headNames(exact) })
    : t("x.run.html_overview", { size, heads: headNames(overview) });
}

function htmlURL(run, heads, extra = {}) {
  const params = new URLSearchParams({ format: "html", ...(heads ? { heads } : {}), lang: lang(), ...extra });
  return runURL(run, `/export?${params}`);
}

// The file's size first: every head's cells while they fit, else the selected head's as far as they fit.
export async function measureHTML() {
  const run = state.run;
  if (!run) return;
  const button = $("#run-html");
  button.disabled = true;
  ui.htmlOffer = null;
  showOffer();
  $("#html-offer-busy").hidden = false;
  try {
    let heads = null;
    let size = await getJSON(htmlURL(run, heads, { dry_run: "1" }));
    if (!size.every_head) {
      heads = `${state.layer}.${state.head}`;
      size = await getJSON(htmlURL(run, heads, { dry_run: "1" }));
    }
    if (state.run !== run) return;
    ui.htmlOffer = { run, heads, size };
    showOffer();
    $("#html-offer-save").focus();
  } finally {
    button.disabled = false;
    $("#html-offer-busy").hidden = true;
  }
}

export async function saveHTML() {
  if (!ui.htmlOffer) return;
  const { run, heads } = ui.htmlOffer;
  ui.htmlOffer = null;
  showOffer();
  $("#run-html").focus();
  await saveFile(htmlURL(run, heads), `attnscope-run-${run.run_id}.html`);
}

export function cancelHTML() {
  ui.htmlOffer = null;
  showOffer();
  $("#run-html").focus();
}

// the offer is about one run: another run takes it away (and the note that a file was opened)
function forgetOffer() {
  if (ui.htmlOffer && ui.htmlOffer.run !== state.run) cancelHTML();
  ui.opened = null;
  showOpened();
}

// "Opened a run file: N tokens, model M", under the run actions, until the next run
function showOpened() {
  const run = state.run;
  const foreign = run && !opened.has(run) ? null : run && ![...$("#model-picker").options].some((o) => o.value === run.model);
  // a run of a model this server has not loaded: said here too (the header's model line is hidden on a phone)
  const said = [ui.opened ? t("x.run.opened", ui.opened) : "", foreign ? t("x.model.not_loaded", { name: run.model }) : ""];
  const note = $("#run-note");
  note.textContent = said.filter(Boolean).join(" ");
  note.hidden = !note.textContent;
}

// ---- wiring -------------------------------------------------------------------------------------------

// `exporting` says an export's failure under the export buttons (export.js).
export function wireRunFiles(exporting) {
  document.addEventListener(NEW_RUN, forgetOffer);
  const buttons = ["#run-download", "#run-open", "#run-html"];
  if (offline) { // the file holds one run and no server: nothing here may ask for another run
    const serverOnly = [...buttons, "#analyze", "#run-hint", ".examples", "#chat-toggle", "#export-json",
                        "#export-kept", ".heat-tools.gen"];
    for (const sel of serverOnly) for (const node of document.querySelectorAll(sel)) node.hidden = true;
    $("#prompt").readOnly = true; // its text is the saved run's
    $("#model-picker").disabled = true;
    return;
  }
  $("#run-download").addEventListener("click", exporting(downloadRun));
  $("#run-open").addEventListener("click", () => $("#run-file").click());
  $("#run-file").addEventListener("change", (ev) => {
    const file = ev.target.files[0];
    ev.target.value = ""; // the same file chosen again opens again
    openRunFile(file);
  });
  $("#run-html").addEventListener("click", exporting(measureHTML));
  $("#html-offer-save").addEventListener("click", exporting(saveHTML));
  $("#html-offer-cancel").addEventListener("click", cancelHTML);
  $("#html-offer").addEventListener("keydown", (ev) => { if (ev.key === "Escape") cancelHTML(); });
  wireDrop();
}

// The offer and the note in the current language.
export function repaintRunFiles() {
  showOffer();
  showOpened();
}
