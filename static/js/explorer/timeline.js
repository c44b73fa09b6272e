// The generate form and what a generation leaves: whether the button can act, the count box and
// its note, the generation's last word (status), and the recorded run's timeline (showStep).
// Each note is kept as a catalogue key and its values, so that a language switch rewrites it.
import { $ } from "../dom.js";
import { state, set, ui } from "../state.js";
import { drawHeatmap } from "../views/heatmap.js";
import { t } from "../i18n.js";
import { inFlight } from "./requests.js";
import { headCaption, labelTimeline } from "./draw.js";
import { selectCell, tools } from "./selection.js";
import { isLong, tileView, tiles } from "./zoom.js";

// Generate needs a decoder with an LM head, and no other run in flight: say why it cannot act.
export function updateGenerate() {
  const current = inFlight();
  const picked = state.models.find((m) => m.name === $("#model-picker").value) || state.model;
  let why = "";
  if (picked && !picked.has_lm_head) why = t("x.gen.why_encoder", { model: picked.name });
  else if (current && current.kind === "analyse") why = t("x.gen.why_analysing");
  else if (current && current.kind === "generate") why = t("x.gen.why_generating");
  const button = $("#generate");
  button.disabled = Boolean(why);
  button.title = why || t("x.gen.title");
  $("#gen-count").disabled = Boolean(why) && !(current && current.kind === "generate");
  $("#gen-why").textContent = why;
  $("#gen-why").hidden = !why;
}

// The generation's last word (ui.generationStatus in state.js): {key, vars, offerContinue}, or null.
export function hideStatus() {
  ui.generationStatus = null;
  $("#gen-status").hidden = true;
  $("#gen-continue").hidden = true;
}

export function showStatus(key, vars = {}, offerContinue = false) {
  ui.generationStatus = { key, vars, offerContinue };
  $("#gen-status span").textContent = t(key, vars);
  $("#gen-status").hidden = false;
  $("#gen-continue").hidden = !offerContinue;
}

// Generate's count: a whole number from 1 to the box's max, or null and a note under the box
// that says what is wrong.
export function genCount() {
  const box = $("#gen-count");
  const max = Number(box.max) || 512;
  const raw = box.value.trim();
  const n = Number(raw);
  if (raw === "" || box.validity.badInput) ui.countProblem = { key: "x.gen.count_empty", vars: { max } };
  else ui.countProblem = Number.isInteger(n) && n >= 1 && n <= max ? null : { key: "x.gen.count_bad", vars: { v: raw, max } };
  showCountProblem();
  if (ui.countProblem) hideStatus(); // the last generation's word would read as this request's answer
  return ui.countProblem ? null : n;
}

// a fixed count clears the note
export function recount() {
  if (ui.countProblem) genCount();
}

function showCountProblem() {
  const note = $("#gen-count-error");
  note.textContent = ui.countProblem ? t(ui.countProblem.key, ui.countProblem.vars) : "";
  note.hidden = !ui.countProblem;
  $("#gen-count").setAttribute("aria-invalid", ui.countProblem ? "true" : "false");
}

// The status and the count's note in the current language.
export function repaintGenerateForm() {
  if (ui.generationStatus) showStatus(ui.generationStatus.key, ui.generationStatus.vars, ui.generationStatus.offerContinue);
  showCountProblem();
}

// Step k of a recorded generation: the heatmap as it stood then, and the newest token of that
// step focused, so that the focus row, the readout and the next-token chart (what the model
// predicted there, and the token it went on to write) move with the timeline too.
export async function showStep(k) {
  const { run } = state;
  const total = Number($("#timeline").max);
  const n = run.tokens.length - (total - k);
  labelTimeline(k);
  const before = state.pos;
  if (before !== n - 1) set({ pos: n - 1, key: n - 1 }); // drawn with the step's heatmap below
  state.extent = k === total ? null : n; // the rows and keys that existed after step k
  if (isLong(run)) await tiles.show(tileView(), 30);
  else {
    const { slice } = state;
    const data = slice.data.subarray(0, (n * (n + 1)) / 2);
    await drawHeatmap($("#heatmap"), { ...slice, n, data }, run.tokens.slice(0, n), { colour: state.colour, title: t("x.step", { layer: state.layer, head: state.head, k }) });
  }
  headCaption(run, state.layer, state.head); // the step's heading, in the page's language
  if (state.run !== run) return;
  selectCell(n - 1);
  if (before !== n - 1) tools.update("pos", state); // selectCell saw the position already set
}
