// The residual stream at the focused position: its norm after each block, and what the
// attention and the MLP of each block add to it.
import { getJSON } from "../api.js";
import { el, showToken } from "../dom.js";
import { plot } from "../chart.js";
import { t } from "../i18n.js";

// The cosine axis: 0..1 while every cosine is >= 0, else down to the smallest one, each end
// padded by a little and rounded out to the axis's 0.2 ticks (a cosine lies in [-1, 1]).
export function cosineRange(values) {
  const finite = values.filter(Number.isFinite);
  const lo = Math.min(0, ...finite), hi = Math.max(1, ...finite);
  const pad = 0.04;
  const down = lo < 0 ? Math.max(-1 - pad, Math.floor((lo - pad) / 0.2) * 0.2) : -pad;
  return [Number(down.toFixed(2)), Number((hi + pad).toFixed(2))];
}

export async function render(body, ctx) {
  const { run, pos } = ctx;
  const res = await getJSON(`/api/runs/${encodeURIComponent(run.run_id)}/residual`);
  const chart = el("div", { class: "chart tool-chart", "data-testid": "residual-chart" });
  const parts = el("div", { class: "chart tool-chart", "data-testid": "residual-parts" });
  body.replaceChildren(el("p", { class: "legend", text: t("resid.help", { pos, token: showToken(run.tokens[pos].text) }) }),
  chart, parts);
  const stages = [t("tool.embed"), ...res.layers.map((l) => t("common.block", { i: l.layer }))];
  const cos = res.layers.map((l) => l.cos_prev[pos]);
  const range = cosineRange(cos);
  await plot(chart, [
    { type: "scatter", mode: "lines+markers", name: t("resid.norm_name"), x: stages, y: [res.embed_norm[pos], ...res.layers.map((l) => l.resid_norm[pos])] },
    { type: "scatter", mode: "lines+markers", name: t("resid.cos_name"), x: stages.slice(1), y: cos, yaxis: "y2" },
  ], { yaxis: { title: { text: t("resid.norm") } },
    // the cosine axis keeps its own ticks (..., 0, 0.2, ... 1), not the norm axis's grid
    yaxis2: { overlaying: "y", side: "right", range, tickmode: "linear", tick0: 0, dtick: 0.2, showgrid: false, title: { text: t("resid.cos") } },
    xaxis: { tickangle: chart.clientWidth < 600 ? -40 : "auto" },
    legend: { orientation: "h", y: 1.2 }, margin: { l: 50, r: 55, t: 30, b: 40 } });
  const layers = res.layers.map((l) => t("common.block", { i: l.layer }));
  await plot(parts, [
    { type: "bar", name: t("resid.attn_adds"), x: layers, y: res.layers.map((l) => l.attn_norm[pos]) },
    { type: "bar", name: t("resid.mlp_adds"), x: layers, y: res.layers.map((l) => l.mlp_norm[pos]) },
  ], { barmode: "group", yaxis: { title: { text: t("resid.added") } }, legend: { orientation: "h", y: 1.2 } });
  chart.dataset.stages = String(stages.length);
  chart.dataset.cosRange = range.join(",");
  chart.dataset.pos = String(pos);
}
