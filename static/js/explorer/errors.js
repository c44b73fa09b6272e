// What went wrong, said on the page: the explorer's one error box (showError, with a way forward
// offered as a button), the note over a failed analyse's stale panels, and the note under a
// truncated prompt. Each keeps what it shows, so that a language switch redraws it (repaintErrors).
import { $, el, isAbort } from "../dom.js";
import { errorText, serverError, t } from "../i18n.js";
import { ui } from "../state.js";

// the error box's error and its offer (a way forward shown as a button: {key, vars, run}). `error` is
// what was thrown (a server refusal is said by its code, in the page's language: errorText) or a
// string of the page's own words; "" (or null) clears the box.
export function showError(error, offer = null) {
  ui.error = error || "";
  ui.errorOffer = ui.error ? offer : null;
  const box = $("#error");
  box.replaceChildren(errorText(ui.error));
  if (ui.errorOffer) {
    box.append(" ", el("button", { type: "button", class: "offer", "data-testid": "error-offer",
                                   text: t(ui.errorOffer.key, ui.errorOffer.vars), onclick: ui.errorOffer.run }));
  }
  box.hidden = !ui.error;
}

// Report a failed fetch to the person; an aborted one was replaced on purpose.
export function report(err) {
  if (isAbort(err)) return;
  showError(err && typeof err === "object" ? err : String(err));
}

// Run a handler and show what goes wrong instead of dropping it.
export const safely = (fn) => (...args) => Promise.resolve().then(() => fn(...args)).catch(report);

// A prompt over the model's token limit: the limit, read from the refusal's params (null: another error).
// Every such refusal (counted whole, "at least", or by its characters) carries the limit.
const TOO_LONG = new Set(["too_long", "too_long_at_least_read", "too_long_at_least_length", "too_long_at_least",
                          "too_long_chars"]);
export function tokenLimitOf(err) {
  const hit = err && err.status === 422 ? serverError(err) : null;
  const limit = hit && TOO_LONG.has(hit.code) ? Number(hit.params.limit) : NaN;
  return Number.isInteger(limit) && limit > 0 ? limit : null;
}

// What a truncated run kept (the prompt box still holds the whole text), said under the prompt.
export function showCut(next = ui.cut) {
  ui.cut = next || null;
  const note = $("#cut-note");
  note.textContent = ui.cut ? t("x.truncated", { n: ui.cut.n, chars: ui.cut.chars.toLocaleString("en-US"), total: ui.cut.total.toLocaleString("en-US") }) : "";
  note.hidden = !ui.cut;
}

// Whether `run` was cut from `prompt` (a long paste): what goes on from it starts from the run's text.
export const cutFrom = (run, prompt) => Boolean(ui.cut && ui.cut.run === run && ui.cut.prompt === prompt);

// A failed analyse leaves the previous run's panels on the page under the new prompt: they are
// faded and a note above them names the prompt they show, until a run loads.
export function markStale(run) {
  ui.staleRun = run || null;
  const note = $("#stale-note");
  const shown = ui.staleRun ? (ui.staleRun.text.length > 120 ? `${ui.staleRun.text.slice(0, 120)}…` : ui.staleRun.text) : "";
  note.textContent = ui.staleRun ? t("x.stale", { prompt: `“${shown}”` }) : "";
  note.hidden = !ui.staleRun;
  for (const id of ["#tokens", "#explorer", "#tools"]) $(id).classList.toggle("stale-panels", Boolean(ui.staleRun));
  document.body.dataset.stale = ui.staleRun ? "1" : "0";
}

// The three in the current language.
export function repaintErrors() {
  showError(ui.error, ui.errorOffer);
  showCut();
  markStale(ui.staleRun);
}
