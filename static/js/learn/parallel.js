// 2. One parallel pass vs serial generation: the prefix table (every row from one forward),
// streamed generation (one step per token), and the KV cache timed fairly at two lengths.
import { el, fmt, showToken } from "../dom.js";
import { postJSON, postStream, readSSE } from "../api.js";
import { figure, plot, wrap } from "../chart.js";
import { sentences } from "../i18n.js";

const LONG = 24; // tokens timed at most: long enough for the cache to pay off, short enough to time in seconds
const ROWS = 64; // rows of the prefix table shown
const cum = (xs) => xs.reduce((acc, v) => [...acc, (acc.at(-1) || 0) + v], []);

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
const within = (v, xs) => v >= Math.min(...xs) && v <= Math.max(...xs);

// Which verdict the timings allow, the same in every language: neither wins when each side's
// median total lies within the other's range of totals (the difference is this machine's noise),
// or when the medians of the totals and the sums of the per-step medians (the curves' ends)
// disagree on the winner; otherwise the smaller sum wins. One slow repeat (a stray pause) widens
// its side's range but does not move the median, so it cannot turn a 2.5× difference into a tie.
export function verdictKey(cacheTotals, noCacheTotals, cacheMs, noCacheMs) {
  const mc = median(cacheTotals), mu = median(noCacheTotals);
  const noise = within(mc, noCacheTotals) && within(mu, cacheTotals);
  if (noise || mc === mu || (mc < mu) !== (cacheMs < noCacheMs)) return "parallel.verdict.tie";
  return cacheMs < noCacheMs ? "parallel.verdict.win" : "parallel.verdict.nowin";
}

// A token's characters as one unbreakable span; rows wrap between tokens, never inside one.
const tok = (s) => el("span", { class: "tok", text: s });
// The prefix 0..i as token spans, each holding the characters that token completes (each once),
// kept to about `max` characters from the end.
function prefixSpans(run, i, max = 48) {
  const parts = [];
  let used = 0;
  let j = i;
  for (; j >= 0 && used < max; j -= 1) {
    const { start, end } = run.tokens[j];
    if (end <= start) continue; // completes no character (a special token, a partial byte)
    const piece = showToken(run.text.slice(start, end));
    parts.unshift(tok(piece));
    used += piece.length;
  }
  if (j >= 0 && run.tokens[j].end > 0) parts.unshift("…"); // earlier characters left out
  return parts.flatMap((p, k) => (k ? [el("wbr"), p] : [p]));
}

// A timing the server refuses as too slow (timing_over_budget, with its estimate) is asked again
// smaller: one repeat for the prompt itself; one repeat and fewer tokens (its cost grows about with
// them) for the repeated one, or none if that would not be longer than the prompt (skippedLong).
async function timeWithin(body, n) {
  try {
    return await postJSON("/api/timing", body);
  } catch (err) {
    if (!(err && err.code === "timing_over_budget")) throw err;
    const { seconds, budget } = err.params;
    if (!body.repeat_to) return postJSON("/api/timing", { ...body, repeats: 1 });
    const fit = Math.min(body.repeat_to, Math.floor((body.repeat_to * 0.6 * budget * body.repeats) / seconds));
    const skip = () => { skippedLong = { n: body.repeat_to, seconds: Math.round(seconds) }; return null; };
    if (fit <= n) return skip();
    try {
      return await postJSON("/api/timing", { ...body, repeats: 1, repeat_to: fit });
    } catch (again) {
      if (again && again.code === "timing_over_budget") return skip();
      throw again;
    }
  }
}
let skippedLong = null; // {n, seconds}: the long timing the server would take too long for (a large model)

export async function render(body, ctx) {
  skippedLong = null;
  const { run, t } = ctx;
  const n = run.tokens.length;
  const facts = el("p", { class: "facts", "data-testid": "parallel-facts" });
  const table = el("table", { "data-testid": "parallel-table" });
  const stream = el("div", { class: "stream", "data-testid": "parallel-stream" });
  const steps = figure("parallel-steps");
  steps.box.hidden = true;
  const go = el("button", { type: "button", "data-testid": "parallel-generate" });
  const serial = el("p", { class: "muted", "data-testid": "parallel-serial" });
  const timingTitle = el("p", { class: "muted", "data-testid": "parallel-timing-title" });
  const timing = figure("parallel-timing", "chart tall");
  const timingLong = figure("parallel-timing-long", "chart tall");
  const verdict = el("p", { class: "facts", "data-testid": "parallel-verdict" });
  body.replaceChildren(el("div", { class: "wide" }, facts), el("div", { class: "scroll wide" }, table),
    el("div", { class: "wide" }, serial, go, stream, steps.box),
    el("div", { class: "wide" }, timingTitle), timing.box, timingLong.box, el("div", { class: "wide" }, verdict));
  let generated = []; // {token, prob, ms}
  let times = null; // [short, long]

  function paintTable() {
    const rows = run.predictions.slice(0, ROWS).map((p, i) => {
      const truth = p.actual_next;
      return el("tr", {},
        el("td", { text: String(i) }), el("td", { text: String(i + 1) }),
        el("td", { class: "mono prefix" }, ...prefixSpans(run, i)),
        el("td", { class: "mono" }, "→ ", tok(showToken(p.top[0].token)), ` (${fmt(p.top[0].prob, 2)})`),
        el("td", { class: "mono" }, truth ? tok(showToken(truth.token)) : t("parallel.not_yet")),
        el("td", { text: truth ? t("parallel.prob_rank", { p: fmt(truth.prob, 3), rank: truth.rank }) : "" }));
    });
    table.replaceChildren(
      el("thead", {}, el("tr", {}, ...["pos", "sees", "prefix", "predicted", "truth", "ptruth"].map((k) => el("th", { text: t(`parallel.col.${k}`) })))),
      el("tbody", {}, ...rows));
    const scored = run.predictions.filter((p) => p.actual_next);
    const hits = scored.filter((p) => p.top[0].id === p.actual_next.id).length;
    facts.textContent = t("parallel.facts", {
      n, ms: fmt(run.timing_ms.forward, 1), visible: (n * (n + 1)) / 2, cells: n * n, hits, rows: scored.length,
      mean: scored.length ? fmt(scored.reduce((a, p) => a + p.actual_next.prob, 0) / scored.length, 3) : "—",
    });
    if (run.predictions.length > ROWS) facts.textContent += ` ${t("parallel.rows_shown", { rows: ROWS, n })}`;
    serial.textContent = t("parallel.serial");
    go.textContent = t("parallel.generate");
  }

  async function paintSteps() {
    if (!generated.length) return;
    steps.box.hidden = false;
    stream.replaceChildren(el("span", { text: ctx.text }), ...generated.map((g) => el("span", { class: g.special ? "new special" : "new", text: g.text,
      title: `${showToken(g.token)} · ${t("parallel.step_hover", { p: fmt(g.prob, 3), ms: fmt(g.ms, 1) })}` })));
    await plot(steps, [{ type: "bar", x: generated.map((_, i) => i + 1), y: generated.map((g) => g.ms), marker: { color: "#2171b5" },
      hovertemplate: t("parallel.steps.hover") + "<extra></extra>" }],
    // plotly never wraps an axis title: on a phone it is broken into lines that fit the chart
    { xaxis: { title: { text: wrap(t("parallel.steps.x"), (steps.clientWidth || 600) - 40).join("<br>") }, dtick: 1 },
      yaxis: { title: { text: t("common.ms") } } });
  }

  async function paintTiming() {
    if (!times) return;
    timingTitle.textContent = sentences([t("parallel.timing.title"), skippedLong ? t("parallel.timing.skipped", skippedLong) : ""]);
    const draw = (div, tm, titleKey) => {
      const x = tm.serial_cache_ms.map((_, i) => i + 1);
      return plot(div, [
        { type: "scatter", mode: "lines", name: t("parallel.t.nocache"), x, y: cum(tm.serial_no_cache_ms), line: { color: "#d94801" } },
        { type: "scatter", mode: "lines", name: t("parallel.t.cache"), x, y: cum(tm.serial_cache_ms), line: { color: "#2171b5" } },
        { type: "scatter", mode: "lines+markers", name: t("parallel.t.parallel", { n: tm.n }), x: [1, tm.n], y: [tm.parallel_ms, tm.parallel_ms], line: { dash: "dot", color: "#333" } },
      ], { title: { text: t(titleKey, { n: tm.n, total: n, repeats: tm.repeats }), font: { size: 12 }, x: 0, xanchor: "left" },
        xaxis: { title: { text: t("parallel.t.x") }, range: [0.5, tm.n + 0.5] },
        yaxis: { title: { text: t("parallel.t.y") }, rangemode: "tozero" }, margin: { t: 16 } });
    };
    timingLong.box.hidden = times.length < 2;
    // the caption says what was timed: the whole prompt, its first tokens, or the prompt repeated
    await Promise.all([draw(timing, times[0], times[0].n < n ? "parallel.timing.cut" : "parallel.timing.short"),
      times[1] && draw(timingLong, times[1], "parallel.timing.long")]);
    timing.dataset.timed = String(times[0].n);
    const parts = times.map((tm) => {
      // the curves' end points: the sums of the per-step medians (the totals' spread beside them)
      const sum = (xs) => xs.reduce((x, y) => x + y, 0);
      const c = sum(tm.serial_cache_ms), u = sum(tm.serial_no_cache_ms);
      const range = (xs) => `${fmt(Math.min(...xs), 1)}–${fmt(Math.max(...xs), 1)}`;
      return t(verdictKey(tm.cache_totals_ms, tm.no_cache_totals_ms, c, u), {
        n: tm.n, c: fmt(c, 1), u: fmt(u, 1), ratio: fmt(u / c, 2), repeats: tm.repeats,
        crange: range(tm.cache_totals_ms), urange: range(tm.no_cache_totals_ms), p: fmt(tm.parallel_ms, 1), px: fmt(c / tm.parallel_ms, 1),
        ms: fmt(run.timing_ms.forward, 1), // the run's own forward, which also captured (parallel.facts)
      });
    });
    verdict.textContent = sentences([...parts, t("parallel.verdict.why")]);
    verdict.dataset.keys = times.map((tm) => verdictKey(tm.cache_totals_ms, tm.no_cache_totals_ms,
      tm.serial_cache_ms.reduce((x, y) => x + y, 0), tm.serial_no_cache_ms.reduce((x, y) => x + y, 0))).join(" ");
  }

  go.addEventListener("click", async () => {
    go.disabled = true;
    generated = [];
    stream.replaceChildren(el("span", { text: ctx.text }));
    try {
      const r = await postStream("/api/generate", { text: ctx.text, model: run.model, max_new_tokens: 16, temperature: 0 });
      for await (const ev of readSSE(r)) {
        if (ev.event !== "token") continue;
        // the characters this token completes (a token holding part of a character adds none yet)
        generated.push({ text: ev.data.special ? ev.data.token : ev.data.text, token: ev.data.token, special: ev.data.special,
          prob: ev.data.prob, ms: ev.data.ms });
        await paintSteps();
      }
      stream.dataset.done = String(generated.length);
    } catch (err) {
      ctx.error(err);
    } finally {
      go.disabled = false;
    }
  });

  // at most LONG tokens, cut where a token ends a character (never inside one)
  let cut = Math.min(n, LONG);
  while (cut > 1 && cut < n && run.tokens[cut].start < run.tokens[cut - 1].end) cut -= 1;
  const text = ctx.text.slice(0, run.tokens[cut - 1].end) || ctx.text;
  ctx.link({ pos: n - 1 });
  await ctx.paint(async () => {
    paintTable();
    await Promise.all([paintSteps(), paintTiming()]);
  });
  // timed after the other lessons are drawn: it holds the model for a few seconds
  ctx.later(async () => {
    timingTitle.textContent = t("parallel.timing.running");
    const short = await timeWithin({ text, model: run.model, repeats: 3 }, n);
    // a short prompt is timed again repeated to LONG tokens, where the cache has room to pay off
    // (fewer on a model too slow to time LONG tokens in the server's budget: it says so)
    const long = n < LONG ? await timeWithin({ text, model: run.model, repeats: 3, repeat_to: LONG }, n) : null;
    times = long ? [short, long] : [short];
    await paintTiming();
  });
}
