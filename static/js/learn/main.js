// The Learn page: run the prompt once on the picked decoder (the picker, or ?model=; the default
// decoder otherwise), then draw the nine views. Every lesson registers a painter that writes its
// words from the catalogue; switching the language calls them all again (no request, no reload).
// On a large model (LAZY_PARAMS) a lesson is drawn when it comes into view, one at a time, so that
// the page answers in seconds; on a small one all nine are drawn at once, in order.
import { $, el } from "../dom.js";
import { getJSON, postJSON } from "../api.js";
import { errorText, initLanguage, lang, onLanguage, sentences, t } from "../i18n.js";
import { chineseNote } from "./note.js";
import * as context from "./context.js";
import * as parallel from "./parallel.js";
import * as ids from "./ids.js";
import * as embedding from "./embedding.js";
import * as shapes from "./shapes.js";
import * as positions from "./positions.js";
import * as encoders from "./encoders.js";
import * as pipeline from "./pipeline.js";
import * as residual from "./residual.js";

// The lessons in the page's order, each named by its topic: its module, its section's id
// (templates/learn.html: <section id="TOPIC">), its catalogue keys ("TOPIC.h") and test ids ("TOPIC-…").
const LESSONS = [
  { topic: "context", module: context },
  { topic: "parallel", module: parallel },
  { topic: "ids", module: ids },
  { topic: "embedding", module: embedding },
  { topic: "shapes", module: shapes },
  { topic: "positions", module: positions },
  { topic: "encoders", module: encoders },
  { topic: "pipeline", module: pipeline },
  { topic: "residual", module: residual },
];
const SEED_PROMPT = "I love artificial intelligence"; // the seed note's own example
// parameters from which a model's lessons are drawn as they come into view: attnscope-tiny (10M) draws
// all nine at once in seconds; SmolLM2-135M needs about 15 s for them on 2 cores, most of it below the fold
const LAZY_PARAMS = 50e6;
const NEAR = "400px"; // a lesson this far below the window is drawn before it is reached
let generation = 0; // the current run's number: a lesson queued for an older run is not drawn
let observer = null; // the current run's IntersectionObserver (lazy lessons)
let unregister = []; // the painters of the current run's lessons
let lastError = null; // the whole run's error (the server's words): repainted in the new language too
// Each lesson's own error line, shown in that lesson (a lesson may move it beside the input it
// answers) and cleared by that lesson's next success or the next run: {box, message} by lesson topic.
const lessonErrors = new Map();

function errorBox(topic) {
  if (!lessonErrors.has(topic)) {
    const box = el("p", { class: "error lesson-error", role: "alert", "data-testid": "lesson-error", hidden: "" });
    lessonErrors.set(topic, { box, error: "" });
  }
  const entry = lessonErrors.get(topic);
  if (!entry.box.isConnected) { // first use, or the lesson's body was redrawn without it
    const section = document.getElementById(topic);
    section.insertBefore(entry.box, section.querySelector(".lesson-body"));
  }
  return entry.box;
}

function paintError() {
  const box = $("#error");
  box.textContent = lastError ? errorText(lastError) : "";
  box.hidden = !lastError;
  for (const { box: b, error, lead } of lessonErrors.values()) {
    b.textContent = error ? sentences([lead ? t(lead.key, lead.vars) : "", errorText(error)]) : "";
    b.hidden = !error;
  }
}

// The Learn page's errors (the explorer's box is explorer/errors.js's showError): a lesson's error goes
// to that lesson, any other to the page's box; an empty one clears it. `error`: what was thrown (a
// server refusal is said by its code: errorText) or a string of the page's own words. ``lead``: a
// catalogue key and its values said before the server's message (which model refused, say).
function showLearnError(error, lesson = null, lead = null) {
  if (lesson) {
    errorBox(lesson);
    lessonErrors.get(lesson).error = error || "";
    lessonErrors.get(lesson).lead = lead;
  } else {
    lastError = error || null;
  }
  paintError();
}

// Painters run now and on every switch; a lesson's painter that throws shows its error.
function painter(lesson) {
  return (fn) => {
    const run = async () => {
      try {
        await fn();
      } catch (err) {
        showLearnError(err, lesson);
      }
    };
    unregister.push(onLanguage(run));
    return run();
  };
}

// The decoder Learn runs on: the picker's, else the default decoder, else any.
function pickedModel(models) {
  const picked = models.find((m) => m.name === $("#model-picker").value && m.causal);
  return picked || models.find((m) => m.default && m.causal) || models.find((m) => m.causal) || models[0];
}

async function runAll(models) {
  const text = $("#prompt").value;
  const dflt = pickedModel(models);
  const mine = ++generation;
  if (observer) observer.disconnect();
  observer = null;
  for (const off of unregister) off();
  unregister = [];
  lastError = null;
  for (const entry of lessonErrors.values()) entry.error = "";
  paintError();
  const lessons = document.querySelector(".lessons");
  delete lessons.dataset.measured;
  for (const body of document.querySelectorAll(".lesson-body")) delete body.dataset.ready;
  $("#busy").hidden = false;
  $("#run").disabled = true;
  let run;
  try {
    run = await postJSON("/api/runs", { text, model: dflt.name, top_k: 5 });
  } catch (err) {
    showLearnError(err);
    $("#busy").hidden = true;
    $("#run").disabled = false;
    return;
  }
  if (mine !== generation) return;
  const summary = () => {
    $("#model-summary").textContent = t("learn.summary", { name: dflt.name, layers: dflt.n_layers, heads: dflt.n_heads, d: dflt.d_model });
    chineseNote($("#lang-note"), run, text);
  };
  unregister.push(onLanguage(summary));
  summary();
  const lazy = (dflt.n_params || 0) > LAZY_PARAMS;
  lessons.dataset.lazy = lazy ? "1" : "";
  const later = []; // slow measurements: after every lesson (all at once), or after their own (lazy)
  let drawn = 0;
  let queue = Promise.resolve();
  const finish = async () => {
    for (const fn of later.splice(0)) {
      if (mine !== generation) return;
      await fn();
    }
    if (drawn === LESSONS.length && mine === generation) lessons.dataset.measured = "1";
  };
  const draw = (i) => {
    const n = LESSONS[i].topic; // what the lesson's errors are filed under
    const section = document.getElementById(n);
    const body = section.querySelector(".lesson-body");
    if (mine !== generation || body.dataset.queued === String(mine)) return;
    body.dataset.queued = String(mine);
    queue = queue.then(async () => {
      if (mine !== generation) return;
      $("#busy").hidden = false;
      const ctx = {
        run, text, models, model: dflt, t, error: (message, lead = null) => showLearnError(message, n, lead), errorBox: () => errorBox(n), paint: painter(n),
        later: (fn) => later.push(async () => {
          try {
            await fn();
          } catch (err) {
            showLearnError(err, n);
          }
        }),
        // "Open in the explorer" with this lesson's prompt, model, layer, head and position
        link(view = {}) {
          const params = new URLSearchParams({
            text: view.text ?? text, model: view.model || run.model, layer: view.layer ?? 0, head: view.head ?? 0,
            pos: view.pos ?? run.tokens.length - 1, lang: lang(),
          });
          section.querySelector(".open").href = `/?${params}`;
        },
      };
      ctx.link({});
      unregister.push(onLanguage(() => {
        const a = section.querySelector(".open");
        const u = new URL(a.href, location.href);
        u.searchParams.set("lang", lang());
        a.href = `${u.pathname}${u.search}`;
      }));
      try {
        await LESSONS[i].module.render(body, ctx);
        if (mine === generation) body.dataset.ready = "1";
      } catch (err) {
        showLearnError(err, n);
      }
      drawn += 1;
      if (lazy || drawn === LESSONS.length) await finish();
      if (lazy && mine === generation) $("#busy").hidden = true; // until the next lesson comes into view
    });
    return queue;
  };
  for (const { topic } of LESSONS) { // a lazy lesson says it waits until it is in view
    const body = document.getElementById(topic).querySelector(".lesson-body");
    delete body.dataset.queued;
    if (lazy) {
      const wait = el("p", { class: "muted", "data-testid": "lesson-waiting" });
      const say = () => { wait.textContent = t("learn.lazy", { model: dflt.name }); };
      say();
      unregister.push(onLanguage(say));
      body.replaceChildren(wait);
    }
  }
  try {
    if (lazy) {
      await draw(0); // the first lesson now; the others as they come near the window
      observer = new IntersectionObserver((entries) => {
        for (const e of entries) if (e.isIntersecting) draw(LESSONS.findIndex((l) => l.topic === e.target.id));
      }, { rootMargin: `0px 0px ${NEAR} 0px` });
      for (const section of document.querySelectorAll(".lesson")) observer.observe(section);
    } else {
      for (const i of LESSONS.keys()) await draw(i);
    }
  } catch (err) {
    showLearnError(err);
  } finally {
    if (mine === generation) {
      if (!lazy) $("#busy").hidden = true;
      $("#run").disabled = false;
    }
  }
}

async function init() {
  // a failed fetch is shown to the person, never dropped as an unhandled rejection
  window.addEventListener("unhandledrejection", (ev) => { showLearnError(ev.reason && typeof ev.reason === "object" ? ev.reason : String(ev.reason)); ev.preventDefault(); });
  await initLanguage();
  onLanguage(paintError);
  const { models } = await getJSON("/api/models");
  const params = new URLSearchParams(location.search);
  $("#prompt").value = params.get("text") || SEED_PROMPT;
  // the picker: the decoders (Learn generates and reads logits), named as in the explorer
  const picker = $("#model-picker");
  const decoders = models.filter((m) => m.causal);
  const fillModels = () => {
    const keep = picker.value;
    picker.replaceChildren(...decoders.map((m) => el("option", { value: m.name, text: t("x.model.option", { name: m.name, family: m.family, dtype: m.dtype, device: m.device }) })));
    if (keep) picker.value = keep;
  };
  fillModels();
  onLanguage(fillModels);
  const wanted = params.get("model");
  picker.value = (decoders.find((m) => m.name === wanted) || pickedModel(models)).name;
  const unknown = () => { // ?model= that is not a decoder here: said, and the default is used
    const note = $("#model-note");
    note.textContent = wanted && picker.value !== wanted ? t("x.model.unknown", { wanted, model: picker.value }) : "";
    note.hidden = !note.textContent;
  };
  unknown();
  onLanguage(unknown);
  const go = () => {
    const p = new URLSearchParams(location.search);
    p.set("text", $("#prompt").value);
    p.set("model", picker.value);
    history.replaceState(null, "", `${location.pathname}?${p}`);
    runAll(models);
  };
  $("#run").addEventListener("click", go);
  picker.addEventListener("change", go);
  $("#prompt").addEventListener("keydown", (ev) => { // Ctrl+Enter runs the prompt, as in the explorer
    if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey) && !$("#run").disabled) $("#run").click();
  });
  await runAll(models);
}

function start() {
  init().catch((err) => {
    const box = $("#error");
    box.textContent = t("learn.start_failed", { message: errorText(err) });
    box.hidden = false;
  });
}
if (window.Plotly) start();
else window.addEventListener("load", start);
