// Exports: the heatmap as PNG or SVG, the head grid as PNG or SVG, and the run as JSON (every
// head's cells) or as what the run keeps (safetensors). A refusal or failure is said under the
// export buttons, where it was asked for.
import { $, el, plotlyText } from "../dom.js";
import { getBlob } from "../api.js";
import { state, ui } from "../state.js";
import { errorText, t } from "../i18n.js";
import { grid } from "./selection.js";
import { shown } from "./zoom.js";

// Hand `url` (a data: or blob: URL) to the browser as a download called `name`.
function save(name, url) {
  const a = el("a", { href: url, download: name });
  document.body.append(a);
  a.click();
  a.remove();
}

export function download(name, blob) {
  const url = URL.createObjectURL(blob);
  save(name, url);
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

// The heatmap as an image that says what it shows (model, head, tokens; a recorded step's
// caption under it) and without the page's selection box.
export async function exportHeatmap(format) {
  const div = $("#heatmap");
  if (!state.run || !div.layout) return;
  const name = plotlyText(t("x.export.title", { model: state.run.model, layer: state.layer, head: state.head, n: shown() }));
  const caption = div.layout.title?.text || "";
  const layout = { ...div.layout, shapes: [], title: { ...div.layout.title, text: caption ? `${name}<br>${caption}` : name },
                   margin: { ...div.layout.margin, b: (div.layout.margin?.b ?? 28) + 22 } };
  const url = await window.Plotly.toImage({ data: div.data, layout },
    { format, width: div.clientWidth, height: div.clientHeight + 22, scale: format === "png" ? 2 : 1 });
  save(`attnscope-L${state.layer}H${state.head}.${format}`, url);
}

// The head grid's thumbnails as one image.
export const exportGrid = (format) => grid.exportImage(format).then((blob) => download(`attnscope-heads.${format}`, blob));

// Every head's cells as JSON.
export async function exportRunJSON() {
  if (!state.run) return;
  let blob;
  try {
    blob = await getBlob(`/api/runs/${encodeURIComponent(state.run.run_id)}/export`);
  } catch (err) { // a long run's JSON (every head's n x n cells) is refused: say so, and what to press instead
    if (!(err && err.code === "export_too_large")) throw err;
    const count = (v) => Number(v).toLocaleString("en-US");
    throw Object.assign(err, { key: "x.export.json_refused", vars: { cells: count(err.params.cells), limit: count(err.params.limit) } });
  }
  download(`attnscope-run-${state.run.run_id}.json`, blob);
}

// what the run keeps (O(n·d)), from which any head is rebuilt exactly: the export of a run of any length
export async function exportKept() {
  if (!state.run) return;
  const blob = await getBlob(`/api/runs/${encodeURIComponent(state.run.run_id)}/export?format=safetensors`);
  download(`attnscope-run-${state.run.run_id}.safetensors`, blob);
}

// An export's refusal or failure (kept as a key or the error itself, so that a language switch
// rewrites it); the next export that succeeds, or another run, clears it.
export function showExportProblem(problem = ui.exportProblem) {
  ui.exportProblem = problem || null;
  const box = $("#export-error");
  box.textContent = !ui.exportProblem ? "" : ui.exportProblem.key ? t(ui.exportProblem.key, ui.exportProblem.vars) : errorText(ui.exportProblem.error);
  box.hidden = !ui.exportProblem;
}

// Run an export and say under the buttons what went wrong, or clear what was said.
export const exporting = (fn) => (...args) => Promise.resolve().then(() => fn(...args)).then(
  () => showExportProblem(null),
  (err) => showExportProblem({ key: err?.key, vars: err?.vars, error: err && typeof err === "object" ? err : String(err) }));
