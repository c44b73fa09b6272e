// The Learn page: run the prompt once on the default decoder, then draw the nine views.
import { $ } from "../dom.js";
import { getJSON, postJSON } from "../api.js";
import { TEXT, pickLanguage } from "./i18n.js";
import * as l1 from "./l1.js";
import * as l2 from "./l2.js";
import * as l3 from "./l3.js";
import * as l4 from "./l4.js";
import * as l5 from "./l5.js";
import * as l6 from "./l6.js";
import * as l7 from "./l7.js";
import * as l8 from "./l8.js";
import * as l9 from "./l9.js";

const LESSONS = [l1, l2, l3, l4, l5, l6, l7, l8, l9];
let lang = pickLanguage();

function t(key) {
  return key.split(".").reduce((o, k) => (o ? o[k] : undefined), TEXT[lang]) ?? key;
}

function applyLanguage() {
  document.documentElement.lang = lang === "zh" ? "zh-CN" : "en";
  for (const node of document.querySelectorAll("[data-i18n]")) node.textContent = t(node.dataset.i18n);
  $("#lang").textContent = t("lang");
}

function showError(message) {
  $("#error").textContent = message;
  $("#error").hidden = !message;
}

async function runAll(models) {
  const text = $("#prompt").value;
  const dflt = models.find((m) => m.default) || models[0];
  showError("");
  $("#busy").hidden = false;
  try {
    const run = await postJSON("/api/runs", { text, model: dflt.name, top_k: 5 });
    $("#model-summary").textContent = `${dflt.name}: ${dflt.n_layers} layers × ${dflt.n_heads} heads, d_model ${dflt.d_model}`;
    const ctx = {
      run, text, models, model: dflt, t, error: showError,
      link(n, view) {
        const params = new URLSearchParams({ text, model: view.model || run.model, layer: view.layer ?? 0, head: view.head ?? 0, pos: view.pos ?? run.tokens.length - 1 });
        document.querySelector(`#l${n} .open`).href = `/?${params}`;
      },
    };
    for (const [i, lesson] of LESSONS.entries()) {
      const body = document.querySelector(`#l${i + 1} .lesson-body`);
      try {
        await lesson.render(body, ctx);
        body.dataset.ready = "1";
      } catch (err) {
        showError(`${t(`l${i + 1}.h`)}: ${err.message}`);
      }
    }
  } catch (err) {
    showError(err.message);
  } finally {
    $("#busy").hidden = true;
  }
}

async function init() {
  // a failed fetch is shown to the person, never dropped as an unhandled rejection
  window.addEventListener("unhandledrejection", (ev) => { showError(ev.reason?.message || String(ev.reason)); ev.preventDefault(); });
  applyLanguage();
  $("#lang").addEventListener("click", () => {
    lang = lang === "en" ? "zh" : "en";
    const params = new URLSearchParams(location.search);
    params.set("lang", lang);
    history.replaceState(null, "", `${location.pathname}?${params}`);
    applyLanguage();
  });
  const { models } = await getJSON("/api/models");
  $("#prompt").value = new URLSearchParams(location.search).get("text") || "I love artificial intelligence";
  $("#run").addEventListener("click", () => runAll(models));
  await runAll(models);
}

function start() {
  init().catch((err) => showError(`Could not start: ${err.message}`));
}
if (window.Plotly) start();
else window.addEventListener("load", start);
