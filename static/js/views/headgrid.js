// Every layer x head as a thumbnail, labelled with its entropy and badged by what the
// engine measured: previous-token, first-token (sink) and induction-like heads.
import { el, fmt, isAbort } from "../dom.js";
import { hexRGB, maskColours, rgb } from "./colour.js";
import { t } from "../i18n.js";

// bins a side of a thumbnail (a canvas of one pixel a bin, scaled by CSS): 64 divides the overview's
// 256, so the server pools a long run's thumbnails from the overviews it already computed
const THUMB = 64;
// [class, score key, threshold, title, the letter a cell shows]: one letter each, so that
// three badges fit a cell of any grid from 4 to 32 heads without covering one another.
// P and S: the score must also be at least halfway from what an evenly spread head scores on
// this prompt to 1 (``badgesFor``), over at least MIN_ROWS rows. I: the server's induction score
// (null without enough copying evidence: no badge).
export const BADGES = [
  ["prev", "prev_token", 0.5, "previous-token head", "P"],
  ["sink", "first_token", 0.6, "first-token (sink) head", "S"],
  ["ind", "induction", 0.3, "induction-like head", "I"],
];
// query rows i >= 1 a prompt needs before P or S is shown: on 2 or 3 tokens every head reads the
// previous and the first token
export const MIN_ROWS = 4;

// One head of a layer's thumbnail tiles (rows x cols bins, NaN where a bin is all masked),
// scaled to the head's largest bin and drawn one pixel a bin.
export function drawThumb(canvas, tile, head) {
  const { rows, cols } = tile;
  canvas.width = cols;
  canvas.height = rows;
  const ctx = canvas.getContext("2d");
  const img = ctx.createImageData(cols, rows);
  const base = head * rows * cols;
  let max = 1e-9;
  for (let i = 0; i < rows * cols; i++) {
    const v = tile.values[base + i];
    if (v > max) max = v;
  }
  const maskRGB = hexRGB(maskColours().fill);
  for (let i = 0; i < rows * cols; i++) {
    const v = tile.values[base + i];
    const [R, G, B] = Number.isNaN(v) ? maskRGB : rgb(Math.sqrt(v / max));
    const p = i * 4;
    img.data[p] = R; img.data[p + 1] = G; img.data[p + 2] = B; img.data[p + 3] = 255;
  }
  ctx.putImageData(img, 0, 0);
}

// A score, or "computing…" while the server still owes it (a fused layer's scores follow the analyse:
// null until then).
export function scoreText(value, digits) {
  return value === null || value === undefined ? t("x.scores.pending") : fmt(value, digits);
}

// Is this head's layer still owed its scores? Entropy is owed with the others on every deferred layer.
export function pending(s) {
  return s.entropy === null;
}

// The induction score: "computing…" while owed; when the prompt holds too little evidence of
// copying, why: how many queries repeat an earlier token far enough back, and how many are needed.
export function inductionText(s, digits, run) {
  if (s.induction !== null) return fmt(s.induction, digits);
  if (pending(s)) return t("x.scores.pending");
  const have = run?.induction_queries ?? 0;
  return have ? t("x.grid.few_repeats", { n: have, need: run.induction_min_queries }) : t("x.grid.no_repeats");
}

function describe(s, kvHead, run) {
  const sparsity = s.top1 === undefined ? "" : t("x.grid.sparsity", { top1: fmt(s.top1, 2), top5: fmt(s.top5, 2), keys: fmt(s.keys_90, 1) });
  return t("x.grid.describe", {
    layer: s.layer, head: s.head, kv: kvHead === null ? "" : t("x.grid.shares_kv", { kv: kvHead }), entropy: scoreText(s.entropy, 2),
    max: scoreText(s.max, 2),
    prev: scoreText(s.prev_token, 2), first: scoreText(s.first_token, 2), ind: inductionText(s, 2, run),
  }) + sparsity;
}

// What a head that spreads its attention evenly would score: on a short prompt even a
// uniform head puts 1/2, 1/3, ... on the previous and the first token.
function uniformScore(n) {
  let sum = 0;
  for (let i = 1; i < n; i++) sum += 1 / (i + 1);
  return n > 1 ? sum / (n - 1) : 1;
}

export function badgesFor(score, n) {
  const chance = uniformScore(n);
  return BADGES.filter(([name, key, threshold]) => score[key] !== null && (name === "ind"
    ? score[key] >= threshold
    : n - 1 >= MIN_ROWS && score[key] >= Math.max(threshold, (1 + chance) / 2)));
}

// A cell's P/S/I badges (none while its scores are owed; set again when they arrive).
function fillBadges(badges, s, n) {
  badges.replaceChildren(...badgesFor(s, n).map(([name, , , , letter]) =>
    el("b", { class: `badge ${name}`, text: letter, title: t(`x.badge.${name}_title`), dataset: { badge: name } })));
}

export class HeadGrid {
  // getTile(runId, spec, {signal}): the tiles' transport (api.js's getTile in the explorer)
  constructor(container, { onSelect, onError = () => {}, getTile }) {
    this.container = container;
    this.onSelect = onSelect;
    this.onError = onError;
    this.getTile = getTile;
    this.canvases = new Map();
    this.token = 0;
    // arrow keys move the selected head: left/right within a layer, up/down across layers
    container.addEventListener("keydown", (ev) => this.key(ev));
    new ResizeObserver(() => this.layout()).observe(container); // a narrower panel wraps the layers
  }

  // More than 8 heads a layer: the explorer gives the grid's column more room (app.css). Called before
  // the run's charts are drawn too, so that they are drawn at the width they keep.
  widen(run) {
    this.container.toggleAttribute("data-wide", run.n_heads > 8);
  }

  // Heads a line: a layer's heads all on one line where the panel has room for cells of --cell-min,
  // else the layer wraps onto as few lines as hold them (its label spanning them; a K/V group kept
  // whole), so that no cell lies outside the panel (12 heads at 1,400 px, 32 anywhere). Sorted, 8.
  layout() {
    const grid = this.container, run = this.run;
    if (!run) return;
    const n = run.n_heads;
    let per = Math.min(8, n), lines = 1;
    if (this.byPosition) {
      const style = getComputedStyle(grid);
      const gap = parseFloat(style.columnGap) || 0;
      const cell = parseFloat(style.getPropertyValue("--cell-min")) || 34;
      const label = 2.4 * parseFloat(style.fontSize);
      // hidden (no width yet): one line a layer until the panel shows
      const fit = grid.clientWidth ? Math.max(1, Math.floor((grid.clientWidth - label) / (cell + gap))) : n;
      per = Math.ceil(n / Math.ceil(n / fit));
      const group = this.group || 1;
      if (group > 1 && per % group) {
        const up = Math.ceil(per / group) * group;
        per = up <= fit ? up : Math.max(group, up - group);
      }
      lines = Math.ceil(n / per);
    }
    const columns = `${this.byPosition ? "2.4em " : ""}repeat(${per}, minmax(var(--cell-min), 1fr))`;
    if (grid.style.gridTemplateColumns !== columns) grid.style.gridTemplateColumns = columns;
    for (const label of grid.querySelectorAll(".row-label")) {
      label.style.gridColumn = "1";
      label.style.gridRow = lines > 1 ? `span ${lines}` : "";
    }
    this.cols = per;
    grid.dataset.cols = String(per);
    grid.dataset.lines = String(lines);
  }

  key(ev) {
    const moves = { ArrowLeft: [0, -1], ArrowRight: [0, 1], ArrowUp: [-1, 0], ArrowDown: [1, 0] };
    if (!this.run || !moves[ev.key]) return;
    ev.preventDefault();
    const cells = [...this.container.querySelectorAll(".head-cell")];
    const at = Math.max(0, cells.findIndex((c) => c.classList.contains("selected")));
    let next;
    if (this.byPosition) {
      const [dl, dh] = moves[ev.key];
      const cur = cells[at].dataset;
      const layer = Math.max(0, Math.min(this.run.n_layers - 1, Number(cur.layer) + dl));
      const head = Math.max(0, Math.min(this.run.n_heads - 1, Number(cur.head) + dh));
      next = cells.find((c) => Number(c.dataset.layer) === layer && Number(c.dataset.head) === head);
    } else { // sorted: move through the order, a row of cols at a time up and down
      const step = { ArrowLeft: -1, ArrowRight: 1, ArrowUp: -this.cols, ArrowDown: this.cols }[ev.key];
      next = cells[Math.max(0, Math.min(cells.length - 1, at + step))];
    }
    if (!next) return;
    next.focus();
    this.onSelect(Number(next.dataset.layer), Number(next.dataset.head));
  }

  render(run, sortKey, selected, model = null) {
    const token = ++this.token; // a newer render cancels thumbnails still loading
    if (this.controller) this.controller.abort();
    this.controller = new AbortController();
    this.container.replaceChildren();
    this.canvases.clear();
    this.run = run;
    const scores = run.heads.slice();
    const byPosition = sortKey === "position";
    if (!byPosition) {
      const sign = sortKey === "entropy" || sortKey === "keys_90" ? 1 : -1; // scores still owed sort last
      const missing = sign > 0 ? Infinity : -1;
      scores.sort((a, b) => sign * ((a[sortKey] ?? missing) - (b[sortKey] ?? missing)));
    }
    this.byPosition = byPosition;
    // grouped-query attention: query heads that share one K/V head stand together
    const kv = model ? model.n_kv_heads : run.n_heads;
    const group = run.n_heads / kv;
    this.group = byPosition ? group : 1;
    this.widen(run);
    if (byPosition && kv < run.n_heads) {
      this.container.append(el("span", { class: "row-label", text: "K/V" }));
      for (let g = 0; g < kv; g++) {
        const label = el("span", { class: "kv-label", text: t("x.grid.kv_group", { g, a: g * group, b: (g + 1) * group - 1 }), dataset: { testid: "kv-group" } });
        label.style.gridColumn = `span ${group}`;
        this.container.append(label);
      }
    }
    let lastLayer = -1;
    for (const s of scores) {
      if (byPosition && s.layer !== lastLayer) {
        this.container.append(el("span", { class: "row-label", text: `L${s.layer}` }));
        lastLayer = s.layer;
      }
      const canvas = el("canvas", { width: THUMB, height: THUMB });
      const badges = el("span", { class: "badges" });
      fillBadges(badges, s, run.tokens.length);
      const cell = el("button", {
        type: "button", class: byPosition && kv < run.n_heads && s.head % group === 0 && s.head > 0 ? "head-cell kv-start" : "head-cell",
        title: describe(s, kv < run.n_heads ? Math.floor(s.head / group) : null, run),
        dataset: { testid: "head-cell", layer: String(s.layer), head: String(s.head),
                   ...(s.keys_90 === undefined ? {} : { keys90: fmt(s.keys_90, 1) }) },
        tabindex: "-1",
        onclick: () => this.onSelect(s.layer, s.head),
      }, canvas, el("span", { class: "lbl" }), badges);
      this.label(cell, s);
      this.container.append(cell);
      this.canvases.set(`${s.layer}:${s.head}`, canvas);
    }
    this.layout(); // cells never narrower than a readable thumbnail: layers wrap, tall grids scroll down
    this.select(selected.layer, selected.head);
    this.loadThumbnails(run, token, this.controller.signal)
      .catch((err) => token === this.token && !isAbort(err) && this.onError(err));
  }

  // The same tiles as the heatmap's overview (max-pooled, 8-bit), THUMB x THUMB bins at most,
  // every head of a layer in one request.
  async loadThumbnails(run, token, signal) {
    const n = run.tokens.length;
    for (let layer = 0; layer < run.n_layers; layer++) {
      const tile = await this.getTile(run.run_id, { layer, q0: 0, q1: n, k0: 0, k1: n, size: THUMB, pool: "max", format: "bin" }, { signal });
      if (token !== this.token) return;
      for (let head = 0; head < run.n_heads; head++) {
        const canvas = this.canvases.get(`${layer}:${head}`);
        if (canvas) drawThumb(canvas, tile, head);
      }
      this.container.dataset.thumbLayers = String(layer + 1);
    }
  }

  // A cell's entropy label and its spoken name ("computing…" while its scores are still owed).
  label(cell, s) {
    // sorted, a cell also names its head: on a line of its own, so that neither is cut in a narrow cell
    const text = this.byPosition ? scoreText(s.entropy, 2) : `L${s.layer}H${s.head}\n${scoreText(s.entropy, 2)}`;
    const lbl = cell.querySelector(".lbl");
    lbl.textContent = text;
    lbl.classList.toggle("named", !this.byPosition);
    cell.setAttribute("aria-label", t("x.grid.cell_aria", { layer: s.layer, head: s.head, entropy: scoreText(s.entropy, 2) }));
    cell.dataset.pending = pending(s) ? "1" : "";
  }

  // Scores that arrive after the run (a fused layer's head scores, sparsity): into each cell's label,
  // tooltip and badges.
  annotate(run) {
    const kv = this.container.querySelectorAll("[data-testid=kv-group]").length || run.n_heads;
    const group = run.n_heads / kv;
    for (const cell of this.container.querySelectorAll(".head-cell")) {
      const s = run.heads.find((h) => h.layer === Number(cell.dataset.layer) && h.head === Number(cell.dataset.head));
      cell.title = describe(s, kv < run.n_heads ? Math.floor(s.head / group) : null, run);
      this.label(cell, s);
      fillBadges(cell.querySelector(".badges"), s, run.tokens.length);
      if (s.keys_90 !== undefined) cell.dataset.keys90 = fmt(s.keys_90, 1);
    }
  }

  // The grid as one picture: PNG from a canvas, or SVG with each thumbnail embedded.
  async exportImage(format) {
    const cells = [...this.canvases.entries()];
    const cols = this.run.n_heads, px = 96, pad = 18;
    const rows = Math.ceil(cells.length / cols);
    const w = cols * (px + 4) + 40, h = rows * (px + pad) + 10;
    if (format === "svg") {
      const esc = (t) => t.replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]));
      const parts = cells.map(([key, canvas], i) => {
        const [layer, head] = key.split(":");
        const x = 40 + (i % cols) * (px + 4), y = Math.floor(i / cols) * (px + pad);
        return `<image x="${x}" y="${y}" width="${px}" height="${px}" href="${canvas.toDataURL()}" style="image-rendering:pixelated"/>` +
          `<text x="${x}" y="${y + px + 12}" font-size="10">${esc(`L${layer}H${head}`)}</text>`;
      });
      return new Blob([`<svg xmlns="http://www.w3.org/2000/svg" width="${w}" height="${h}">${parts.join("")}</svg>`], { type: "image/svg+xml" });
    }
    const out = document.createElement("canvas");
    out.width = w; out.height = h;
    const ctx = out.getContext("2d");
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, w, h);
    ctx.imageSmoothingEnabled = false;
    ctx.fillStyle = "#333"; ctx.font = "10px sans-serif";
    cells.forEach(([key, canvas], i) => {
      const x = 40 + (i % cols) * (px + 4), y = Math.floor(i / cols) * (px + pad);
      ctx.drawImage(canvas, x, y, px, px);
      const [layer, head] = key.split(":");
      ctx.fillText(`L${layer}H${head}`, x, y + px + 12);
    });
    return new Promise((resolve) => out.toBlob(resolve, "image/png"));
  }

  select(layer, head) {
    for (const cell of this.container.querySelectorAll(".head-cell")) {
      const on = Number(cell.dataset.layer) === layer && Number(cell.dataset.head) === head;
      cell.classList.toggle("selected", on);
      cell.setAttribute("aria-pressed", on ? "true" : "false");
      cell.tabIndex = on ? 0 : -1; // one tab stop; arrow keys move inside the grid
    }
  }
}
