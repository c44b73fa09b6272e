// Models the server offers but has not loaded (an installed real model beside the bundled default):
// listed in the picker, loaded when picked (POST /api/models/NAME/load), then ordinary models.
import { $, el } from "../dom.js";
import { getJSON, postJSON } from "../api.js";
import { set, ui } from "../state.js";
import { errorText, t } from "../i18n.js";


export function setOffered(list) {
  ui.offeredModels = list || [];
}

export function isOffered(name) {
  return ui.offeredModels.some((m) => m.name === name);
}

// The picker's options for the offered models (after the loaded ones).
export function offeredOptions() {
  return ui.offeredModels.map((m) => el("option", { value: m.name, text: t("x.model.offered", { name: m.name }), title: m.about }));
}

// Load the picked offered model; the note beside the picker says so meanwhile. Resolves to the server's
// model list once it is loaded (the picker is refilled by the caller), or null when loading failed.
export async function loadOffered(name) {
  const picker = $("#model-picker");
  const note = $("#model-note");
  const analyse = $("#analyze");
  picker.disabled = true;
  analyse.disabled = true;
  note.hidden = false;
  note.textContent = t("x.model.loading", { name });
  try {
    await postJSON(`/api/models/${encodeURIComponent(name)}/load`, {});
    const { models, available } = await getJSON("/api/models");
    setOffered(available);
    set({ models });
    note.hidden = true;
    note.textContent = "";
    return models;
  } catch (err) {
    note.textContent = t("x.model.load_failed", { name, why: errorText(err) });
    return null;
  } finally {
    picker.disabled = false;
    analyse.disabled = false;
  }
}
