// The residual stream at the focused position: its norm after each block, and what the
// attention and the MLP of each block add to it.
import { getJSON } from "../api.js";
import { el, showToken } from "../dom.js";
import { plot } from "./common.js";

export async function render(body, ctx) {
  const { run, pos } = ctx;
  const res = await getJSON(`/api/runs/${encodeURIComponent(run.run_id)}/residual`);
  const chart = el("div", { class: "chart tool-chart", "data-testid": "residual-chart" });
  const parts = el("div", { class: "chart tool-chart", "data-testid": "residual-parts" });
  body.replaceChildren(el("p", { class: "legend", text: `Token ${pos} ${showToken(run.tokens[pos].text)}: the residual ` +
    "stream's norm after each block and its cosine to the previous stage; below, how much each block's attention and MLP add." }),
  chart, parts);
  const stages = ["embed", ...res.layers.map((l) => `block ${l.layer}`)];
  await plot(chart, [
    { type: "scatter", mode: "lines+markers", name: "‖residual‖", x: stages, y: [res.embed_norm[pos], ...res.layers.map((l) => l.resid_norm[pos])] },
    { type: "scatter", mode: "lines+markers", name: "cosine to the previous stage", x: stages.slice(1), y: res.layers.map((l) => l.cos_prev[pos]), yaxis: "y2" },
  ], { yaxis: { title: { text: "norm" } }, yaxis2: { overlaying: "y", side: "right", range: [0, 1], title: { text: "cosine" } },
    legend: { orientation: "h", y: 1.2 }, margin: { l: 50, r: 55, t: 30, b: 40 } });
  const layers = res.layers.map((l) => `block ${l.layer}`);
  await plot(parts, [
    { type: "bar", name: "attention adds", x: layers, y: res.layers.map((l) => l.attn_norm[pos]) },
    { type: "bar", name: "MLP adds", x: layers, y: res.layers.map((l) => l.mlp_norm[pos]) },
  ], { barmode: "group", yaxis: { title: { text: "‖added vector‖" } }, legend: { orientation: "h", y: 1.2 } });
  chart.dataset.stages = String(stages.length);
  chart.dataset.pos = String(pos);
}
