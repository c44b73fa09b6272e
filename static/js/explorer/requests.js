// The one request in flight (an analyse or a generation). The newest request wins: starting one
// aborts the one before, and every await checks that its request is still the latest before it
// touches the page. The busy line says what is running; whoever follows it (the generate button)
// is told through onBusy.
import { $ } from "../dom.js";
import { t } from "../i18n.js";
import { ui } from "../state.js";

const followers = []; // called whenever the request in flight changes

export function begin(kind) {
  if (ui.request) ui.request.controller.abort();
  ui.request = { kind, controller: new AbortController(), steps: 0 };
  showBusy();
  return ui.request;
}

export const latest = (req) => req === ui.request;

export function end(req) {
  if (!latest(req)) return;
  ui.request = null;
  showBusy();
}

// the request in flight, or null
export const inFlight = () => ui.request;

export function onBusy(fn) {
  followers.push(fn);
}

// The busy line (and the page's data-busy) for the request in flight, in the current language.
export function showBusy() {
  const box = $("#busy");
  box.hidden = !ui.request;
  box.textContent = !ui.request ? "" : ui.request.kind === "generate" ? t("x.gen.busy") : t("x.busy");
  document.body.dataset.busy = ui.request ? ui.request.kind : "";
  for (const fn of followers) fn();
}
