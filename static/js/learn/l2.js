// 2. One parallel pass vs serial generation: the prefix table, streamed generation, timing.
import { el, fmt, showToken } from "../dom.js";
import { postJSON, postStream, readSSE } from "../api.js";
import { legendAbove, plot } from "./charts.js";

export async function render(body, ctx) {
  const { run, t } = ctx;
  const rows = run.predictions.slice(0, 40).map((p, i) => {
    const prefix = run.text.slice(0, run.tokens[i].end); // the characters completed so far, each once
    const truth = p.actual_next;
    return el("tr", {},
      el("td", { class: "mono", text: prefix.length > 48 ? `…${prefix.slice(-48)}` : prefix }),
      el("td", { class: "mono", text: `→ ${showToken(p.top[0].token)} (${fmt(p.top[0].prob, 2)})` }),
      el("td", { class: "mono", text: truth ? showToken(truth.token) : "—" }),
      el("td", { text: truth ? `${fmt(truth.prob, 3)} (rank ${truth.rank})` : "" }));
  });
  const table = el("table", { "data-testid": "l2-table" },
    el("thead", {}, el("tr", {}, ...["prefix", "predicted", "truth", "ptruth"].map((k) => el("th", { text: t(`l2.${k}`) })))),
    el("tbody", {}, ...rows));
  const stream = el("div", { class: "stream", "data-testid": "l2-stream" });
  const steps = el("div", { class: "chart", "data-testid": "l2-steps" });
  const go = el("button", { type: "button", "data-testid": "l2-generate", text: t("l2.generate") });
  const timing = el("div", { class: "chart tall", "data-testid": "l2-timing" });
  body.replaceChildren(el("div", { class: "scroll wide" }, table), el("div", {}, go, stream, steps), el("div", {}, el("p", { class: "muted", text: t("l2.timing") }), timing));

  go.addEventListener("click", async () => {
    go.disabled = true;
    stream.replaceChildren(el("span", { text: ctx.text }));
    const ms = [];
    try {
      const r = await postStream("/api/generate", { text: ctx.text, model: run.model, max_new_tokens: 16, temperature: 0 });
      for await (const ev of readSSE(r)) {
        if (ev.event !== "token") continue;
        // the characters this token completes (a token holding part of a character adds none yet)
        const shown = ev.data.special ? ev.data.token : ev.data.text;
        stream.append(el("span", { class: ev.data.special ? "new special" : "new", text: shown,
          title: `${showToken(ev.data.token)} · p=${fmt(ev.data.prob, 3)} · ${fmt(ev.data.ms, 1)} ms` }));
        ms.push(ev.data.ms);
        plot(steps, [{ type: "bar", x: ms.map((_, i) => i + 1), y: ms, marker: { color: "#2171b5" } }],
          { xaxis: { title: { text: "generated token (step 1 = the prompt's prefill)" } }, yaxis: { title: { text: "ms" } } });
      }
      stream.dataset.done = String(ms.length);
    } catch (err) {
      ctx.error(err.message);
    } finally {
      go.disabled = false;
    }
  });

  const words = run.text.slice(0, run.tokens[Math.min(64, run.tokens.length) - 1].end);
  const tm = await postJSON("/api/timing", { text: words, model: run.model });
  const cum = (xs) => xs.reduce((acc, v) => [...acc, (acc.at(-1) || 0) + v], []);
  const x = tm.serial_cache_ms.map((_, i) => i + 1);
  await plot(timing, [
    { type: "scatter", mode: "lines", name: "serial, no KV cache (prefix recomputed)", x, y: cum(tm.serial_no_cache_ms) },
    { type: "scatter", mode: "lines", name: "serial, with KV cache", x, y: cum(tm.serial_cache_ms) },
    { type: "scatter", mode: "lines", name: `one parallel forward over all ${tm.n} tokens`, x: [1, tm.n], y: [tm.parallel_ms, tm.parallel_ms], line: { dash: "dot" } },
  ], { xaxis: { title: { text: "tokens processed" } }, yaxis: { title: { text: "cumulative ms" }, rangemode: "tozero" }, ...legendAbove(3) });
  ctx.link(2, {});
}
