// Generate with the KV cache, recording every step: the live view fills as tokens stream in, then
// the recording becomes an ordinary run with a timeline.
import { $, isAbort } from "../dom.js";
import { getJSON, postStream, readSSE } from "../api.js";
import { state, ui } from "../state.js";
import { LiveHeatmap } from "../views/live.js";
import { errorText, t } from "../i18n.js";
import { cutFrom, report, showCut, showError } from "./errors.js";
import { begin, end, inFlight, latest } from "./requests.js";
import { analyse, loadRun } from "./analyse.js";
import { genCount, hideStatus, showStatus } from "./timeline.js";

// ms between two redraws of the live view at least: ten a second look continuous, and the CPU
// is left to the stream (bench/browser.py: the browser's share of it slows the server's steps)
const LIVE_GAP = 100;

// Go on from the last generation's text past its end-of-text token.
export function continueGeneration() {
  return ui.lastGeneration && generateAndRecord({ stopAtEos: false, text: ui.lastGeneration.text });
}

// Generate with the KV cache, recording every step: the heatmap fills row by row as tokens
// stream in — redrawn at most once per animation frame (and ten times a second), painting only
// the new rows, so the page keeps up with the stream and stays responsive — then the recording
// becomes an ordinary run with a timeline, drawn in pieces (pause) with the page answering
// between them.
export async function generateAndRecord({ stopAtEos = true, text = null } = {}) {
  const asked = genCount(); // 0, -3 or nothing: said under the box, and nothing starts
  if (asked === null) {
    $("#gen-count").focus();
    return;
  }
  if (text !== null) $("#prompt").value = text;
  // a run cut from the prompt box's text (a long paste) goes on from the beginning it analysed
  const cutOf = (run) => cutFrom(run, $("#prompt").value);
  if (!state.run || (state.run.text !== $("#prompt").value && !cutOf(state.run)) || state.run.model !== $("#model-picker").value) await analyse();
  if (!state.run || !state.model.has_lm_head || inFlight()) return;
  const prompt = cutOf(state.run) ? state.run.text : $("#prompt").value;
  const body = { text: prompt, model: state.run.model, max_new_tokens: asked, temperature: Number($("#gen-temp").value),
                 top_k: 0, top_p: 1, seed: 0, stop_at_eos: stopAtEos, record: true, watch_layer: state.layer, watch_head: state.head };
  ui.lastGeneration = body;
  const { layer, head } = state;
  showError("");
  showCut(null); // the prompt box will hold the generated text
  hideStatus();
  const req = begin("generate");
  const rows = [];
  const tokens = state.run.tokens.slice();
  const div = $("#heatmap");
  let frame = 0, timer = 0, lastDraw = -Infinity, draws = 0, painted = 0, steps = 0, serverMs = 0, done = null, runId = null;
  const liveBox = $("#live");
  // sized once for the whole generation; each redraw paints only the rows that arrived since
  const live = new LiveHeatmap($("#live-canvas"), tokens.length + asked, state.colour);
  const draw = () => {
    frame = 0;
    lastDraw = performance.now();
    if (!latest(req) || !rows.length) return;
    liveBox.hidden = false;
    div.classList.add("under-live"); // the previous run's heatmap would show round the overlay
    painted += live.draw(rows);
    $("#live-caption").textContent = t("x.recording", { layer, head, rows: rows.length, steps });
    draws += 1;
    div.dataset.liveRows = String(rows.length);
    div.dataset.liveDraws = String(draws);
    div.dataset.livePainted = String(painted); // rows painted, over all redraws: each row once
    $("#busy").textContent = t("x.gen.progress", { steps, asked });
  };
  // one redraw per animation frame at most, and none sooner than LIVE_GAP ms after the last:
  // the tokens that arrive meanwhile share the next one
  const schedule = () => {
    if (frame || timer) return;
    const wait = lastDraw + LIVE_GAP - performance.now();
    if (wait <= 0) frame = requestAnimationFrame(draw);
    else timer = setTimeout(() => { timer = 0; frame = requestAnimationFrame(draw); }, wait);
  };
  try {
    const r = await postStream("/api/generate", body, { signal: req.controller.signal });
    for await (const ev of readSSE(r)) {
      if (!latest(req)) return;
      if (ev.data.rows) rows.push(...ev.data.rows);
      if (ev.event === "token") {
        steps += 1;
        req.steps = steps;
        tokens.push({ index: tokens.length, id: ev.data.id, text: ev.data.token, start: 0, end: 0, special: ev.data.special, partial: ev.data.partial });
        div.dataset.liveTokens = String(steps);
        serverMs += ev.data.ms;
        div.dataset.liveServerMs = serverMs.toFixed(1); // the server's own time for the steps (bench/browser.py)
      }
      if (ev.event === "run") runId = ev.data.run_id;
      if (ev.event === "done") done = ev.data;
      schedule();
    }
    cancelAnimationFrame(frame);
    clearTimeout(timer);
    if (!latest(req)) return;
    draw(); // the last rows, before the full heatmap replaces the live view
    const run = await getJSON(`/api/runs/${encodeURIComponent(runId)}`, { signal: req.controller.signal });
    if (!latest(req)) return;
    $("#prompt").value = run.text; // prompt + generated text; an end-of-text token adds none (the strip marks it)
    await loadRun(run, { layer, head, pos: run.tokens.length - 1, steps });
    div.dataset.liveDraws = String(draws);
    if (done && done.stop === "eos") {
      showStatus("x.gen.eos", { n: done.n_new, asked }, true);
    } else if (done) {
      showStatus(stopAtEos ? "x.gen.length" : "x.gen.length_no_eos", { n: done.n_new });
    }
    $("#gen-status").dataset.stop = done ? done.stop : "";
  } catch (err) {
    if (isAbort(err) || !latest(req)) {
      showStatus("x.gen.replaced", { n: steps });
      $("#gen-status").dataset.stop = "client";
    } else {
      report(err);
      showStatus("x.gen.failed", { message: errorText(err && typeof err === "object" ? err : String(err)) }); // by the button too
    }
  } finally {
    cancelAnimationFrame(frame);
    clearTimeout(timer);
    const now = inFlight();
    if (latest(req) || !now || now.kind !== "generate") {
      liveBox.hidden = true;
      div.classList.remove("under-live");
    }
    end(req);
  }
}
