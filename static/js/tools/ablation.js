// Head ablation: toggle heads off (zero or mean), see the next-token distribution at the
// focused position and a per-position KL strip change; one click scans every head.
import { postJSON } from "../api.js";
import { el, fmt, showToken } from "../dom.js";
import { SCALE } from "../views/colour.js";
import { DIVERGING, symmetric, tokenTicks } from "./common.js";
import { label, plot } from "../chart.js";
import { t } from "../i18n.js";

export async function render(body, ctx) {
  const { run, pos } = ctx;
  const L = run.n_layers;
  const H = run.n_heads;
  const off = new Set((ctx.params.ablate || "").split(",").filter((s) => /^\d+\.\d+$/.test(s)));
  const mode = el("select", { "data-testid": "ablation-mode" }, el("option", { value: "zero", text: t("abl.zero") }), el("option", { value: "mean", text: t("abl.mean") }));
  if (ctx.params.mode === "mean") mode.value = "mean";
  const toggles = el("div", { class: "ablate-grid", style: `grid-template-columns: auto repeat(${H}, 1fr)` });
  toggles.append(el("span"), ...Array.from({ length: H }, (_, h) => el("span", { class: "muted", text: `H${h}` })));
  for (let l = 0; l < L; l++) {
    toggles.append(el("span", { class: "muted", text: `L${l}` }));
    for (let h = 0; h < H; h++) {
      const key = `${l}.${h}`;
      const b = el("button", { type: "button", class: "ablate-toggle", "data-testid": `ablate-${l}-${h}`, title: t("common.layer_head", { layer: l, head: h }),
        "aria-pressed": String(off.has(key)), text: t(off.has(key) ? "abl.off" : "abl.on") });
      b.addEventListener("click", () => {
        if (off.has(key)) off.delete(key); else off.add(key);
        b.setAttribute("aria-pressed", String(off.has(key)));
        b.textContent = t(off.has(key) ? "abl.off" : "abl.on");
        update().catch((e) => ctx.error(e));
      });
      toggles.append(b);
    }
  }
  const scanButton = el("button", { type: "button", "data-testid": "ablation-scan-button", text: t("abl.scan") });
  const next = el("div", { class: "chart tool-chart short", "data-testid": "ablation-next" });
  next.dataset.tokenY = "1"; // its categories are ranked token text (tests/i18n_check.py)
  const kl = el("div", { class: "chart tool-chart strip", "data-testid": "ablation-kl" });
  const scanDiv = el("div", { class: "chart tool-chart", "data-testid": "ablation-scan" });
  const note = el("p", { class: "legend tool-result", "data-testid": "ablation-note" });
  const panel = el("div", { "data-testid": "ablation-panel", class: "ablation-panel" },
    el("div", { class: "tool-controls" }, t("abl.mode"), mode, " ", scanButton,
      el("span", { class: "muted", text: t("abl.hint", { pos, token: showToken(run.tokens[pos].text) }) })),
    ctx.alert, toggles, note, next, kl, scanDiv);
  body.replaceChildren(panel);

  let seq = 0;
  async function update() {
    const mine = ++seq;
    const heads = [...off].map((k) => k.split(".").map(Number));
    ctx.setParams({ ablate: [...off].join(","), mode: mode.value });
    const res = await postJSON(`/api/runs/${encodeURIComponent(run.run_id)}/ablate`, { heads, mode: mode.value, top_k: 8 });
    if (mine !== seq) return;
    ctx.error("");
    const p = res.positions[pos];
    const top = p.top.slice().reverse();
    const names = top.map((c, i) => `${top.length - i}. ${label(c.token)}`);
    await plot(next, [
      { type: "bar", orientation: "h", name: t("abl.before"), x: top.map((c) => c.prob_before), y: names,
        hovertemplate: t("abl.hover_before"), marker: { color: "#bdbdbd" } },
      { type: "bar", orientation: "h", name: t("abl.after"), x: top.map((c) => c.prob), y: names,
        hovertemplate: t("abl.hover_after"), marker: { color: "#2171b5" } }],
    { barmode: "group", legend: { orientation: "h", yref: "container", y: 0, yanchor: "bottom" }, margin: { l: 110, r: 10, t: 30, b: 70 },
      xaxis: { rangemode: "tozero", title: { text: t("x.next.x") } },
      title: { text: t("abl.next_title", { pos }), font: { size: 12 } } });
    const ticks = tokenTicks(run.tokens);
    // KL >= 0: a sequential scale from 0 (white); nothing ablated is all white, not mid-scale
    const kls = res.positions.map((q) => q.kl);
    const klMax = Math.max(0, ...kls.filter(Number.isFinite));
    await plot(kl, [{ type: "heatmap", z: [kls], y: ["KL"], colorscale: SCALE, zmin: 0, zmax: klMax > 0 ? klMax : 1,
      hovertemplate: t("abl.kl_hover"), colorbar: { thickness: 8, nticks: 3 } }],
    { margin: { l: 40, r: 10, t: 24, b: 60 }, xaxis: ticks, title: { text: t("abl.kl_title"), font: { size: 12 } } });
    kl.dataset.max = String(klMax);
    panel.dataset.heads = String(heads.length);
    const a = p.actual_next;
    note.textContent = heads.length === 0 ? t("abl.none") :
      t("abl.note", { n: heads.length, mode: t(`abl.${mode.value}`), pos, kl: fmt(p.kl, 4) }) +
      (a ? t("abl.next_prob", { token: showToken(a.token), before: fmt(a.prob_before, 3), after: fmt(a.prob_after, 3) }) : "");
  }

  async function scan() {
    scanButton.disabled = true;
    ctx.error("");
    try {
      const res = await postJSON(`/api/runs/${encodeURIComponent(run.run_id)}/ablate/scan`, { position: pos, mode: mode.value });
      const z = res.effects.map((row, l) => [...row, res.mlp[l]]);
      const m = symmetric(z);
      await plot(scanDiv, [{ type: "heatmap", z, x: [...Array.from({ length: H }, (_, h) => t("common.head", { i: h })), t("tool.mlp")],
        y: Array.from({ length: L }, (_, l) => t("common.layer", { i: l })), colorscale: DIVERGING, zmin: -m, zmax: m, xgap: 1, ygap: 1,
        hovertemplate: "%{y} · %{x}: Δ ln p = %{z:.3f}<extra></extra>" }],
      { yaxis: { autorange: "reversed" }, title: { text: t("abl.scan_title", { token: label(res.token.token), pos, mode: t(`abl.${res.mode}`) }), font: { size: 12 } } });
      scanDiv.dataset.token = String(res.token.id);
      scanDiv.dataset.cells = String(z.length * z[0].length);
      scanDiv.on("plotly_click", (ev) => {
        const [l, h] = ev.points[0].pointIndex;
        if (h < H) ctx.selectHead(l, h);
      });
    } catch (err) {
      ctx.error(err);
    } finally {
      scanButton.disabled = false;
    }
  }
  mode.addEventListener("change", () => update().catch((e) => ctx.error(e)));
  scanButton.addEventListener("click", scan);
  await update();
}
