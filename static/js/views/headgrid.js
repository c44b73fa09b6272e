// Every layer x head as a thumbnail, labelled with its entropy and badged by what the
// engine measured: previous-token, first-token (sink) and induction-like heads. A model with more
// heads than thumbnails fit (SmolLM2's 270, a 70B's 5,120) gets the overview instead (overview.js:
// one canvas, a cell a head, coloured by the sort's score) and a list of the heads the sort and the
// filter pick, whose thumbnails are fetched only when they scroll into view.
import { el, fmt, isAbort } from "../dom.js";
import { hexRGB, maskColours, rgb } from "./colour.js";
import { t } from "../i18n.js";
import { HeadOverview, LOW_FIRST } from "./overview.js";

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
// A sink is a pretrained model's resting state: on an everyday sentence 120-180 of SmolLM2's 270 heads
// pass the S rule, and a badge on most cells tells nothing. Where more than this fraction of the heads
// (and more than SINK_FEW) are sinks, no cell is badged S: the grid says how many there are instead,
// and the S filter (or the overview coloured by first-token score) still finds them.
export const SINK_COMMON = 0.25;
export const SINK_FEW = 3;
// more heads than this: the overview, not a thumbnail a head
export const OVERVIEW_MIN = 128;
// heads the overview's list shows at first, and more each time it is asked
const LIST_STEP = 48;

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

// The badges a head's scores earn by their rule; sinks false: without S (sinks are common on this run).
export function badgesFor(score, n, sinks = true) {
  const chance = uniformScore(n);
  return BADGES.filter(([name, key, threshold]) => score[key] !== null && score[key] !== undefined && (name === "ind"
    ? score[key] >= threshold
    : n - 1 >= MIN_ROWS && score[key] >= Math.max(threshold, (1 + chance) / 2)) && (sinks || name !== "sink"));
}

// How many of a run's heads pass the S rule, and whether that is so many that S is not drawn.
export function sinkCount(heads, n) {
  const count = heads.filter((s) => badgesFor(s, n).some(([name]) => name === "sink")).length;
  return { count, common: count > SINK_FEW && count > SINK_COMMON * heads.length };
}

// A cell's P/S/I badges (none while its scores are owed; set again when they arrive).
function fillBadges(badges, s, n, sinks) {
  badges.replaceChildren(...badgesFor(s, n, sinks).map(([name, , , , letter]) =>
    el("b", { class: `badge ${name}`, text: letter, title: t(`x.badge.${name}_title`), dataset: { badge: name } })));
}

// The grid's filter: all heads, those with any badge shown, or those a rule marks (S: sinks too where
// they are too common to be badged).
export function passes(filter, s, n, sinks) {
  if (filter === "all") return true;
  if (filter === "any") return badgesFor(s, n, sinks).length > 0;
  return badgesFor(s, n).some(([name]) => name === filter);
}

// a score's order: low first for entropy and keys_90, high first for the rest; owed scores last
function sortHeads(heads, key) {
  const sign = LOW_FIRST.has(key) ? 1 : -1;
  const missing = sign > 0 ? Infinity : -Infinity;
  return heads.slice().sort((a, b) => sign * ((a[key] ?? missing) - (b[key] ?? missing)));
}

export class HeadGrid {
  // getTile(runId, spec, {signal}): the tiles' transport (api.js's getTile in the explorer); note: the
  // line under the grid that says what a rule leaves undrawn (sinks too common to badge)
  constructor(container, { onSelect, onError = () => {}, getTile, note = null, onSource = () => {} }) {
    this.container = container;
    this.onSource = onSource;
    this.onSelect = onSelect;
    this.onError = onError;
    this.getTile = getTile;
    this.note = note;
    this.canvases = new Map();
    this.token = 0;
    this.filter = "all";
    this.selected = { layer: 0, head: 0 };
    // arrow keys move the selected head: left/right within a layer, up/down across layers
    container.addEventListener("keydown", (ev) => this.key(ev));
    new ResizeObserver(() => this.resized()).observe(container); // a narrower panel wraps the layers
  }

  // The scores the grid labels, badges and sorts by: this prompt's (the run's), or a corpus survey's per-head
  // means (``setCorpus``: {heads, rows, documents, tokens}; rows: its mean window length, for the badge rules).
  scoresOf(run) {
    return this.corpusFor(run) ? this.corpus.heads : run.heads;
  }

  rowsOf(run) {
    return this.corpusFor(run) ? this.corpus.rows : run.tokens.length;
  }

  // data-source says whose scores the grid shows; onSource (the badge legend) hears it
  markSource(run) {
    const source = this.corpusFor(run) ? "corpus" : "prompt";
    this.container.dataset.source = source;
    this.onSource(source);
  }

  // a survey speaks for a run of its own model only (another model's heads are other heads)
  corpusFor(run) {
    const c = this.corpus;
    return Boolean(c && run && c.model === run.model && c.n_layers === run.n_layers && c.n_heads === run.n_heads);
  }

  setCorpus(corpus) {
    this.corpus = corpus;
    if (this.run) this.render(this.run, this.sortKey, this.selected, this.model); // render marks the source
    else this.markSource(null);
  }

  // More than 8 heads a layer: the explorer gives the grid's column more room (app.css). Called before
  // the run's charts are drawn too, so that they are drawn at the width they keep.
  widen(run) {
    this.container.toggleAttribute("data-wide", run.n_heads > 8 || run.n_layers * run.n_heads > OVERVIEW_MIN);
  }

  // thumbnails of --cell-min a line in the grid's width
  fit(width) {
    const style = getComputedStyle(this.container);
    const gap = parseFloat(style.columnGap) || 0;
    const cell = parseFloat(style.getPropertyValue("--cell-min")) || 34;
    const label = 2.4 * parseFloat(style.fontSize);
    return Math.max(1, Math.floor((width - label) / (cell + gap)));
  }

  // The overview where thumbnails would not do: more than OVERVIEW_MIN heads, or K/V groups whose layer
  // would wrap (its groups' headers would no longer sit over their heads).
  wantsOverview(run, group) {
    if (run.n_layers * run.n_heads > OVERVIEW_MIN) return true;
    const width = this.container.clientWidth;
    return group > 1 && width > 0 && this.fit(width) < run.n_heads;
  }

  resized() {
    if (!this.run) return;
    if (this.wantsOverview(this.run, this.group) !== this.isOverview) {
      this.render(this.run, this.sortKey, this.selected, this.model);
    } else if (this.isOverview) {
      this.ov.draw(Math.floor(this.container.clientWidth));
    } else {
      this.layout();
    }
  }

  setFilter(filter) {
    this.filter = filter;
    if (this.run) this.render(this.run, this.sortKey, this.selected, this.model);
  }

  // Heads a line: a layer's heads all on one line where the panel has room for cells of --cell-min,
  // else the layer wraps onto as few lines as hold them (its label spanning them; a K/V group kept
  // whole), so that no cell lies outside the panel (12 heads at 1,400 px, 32 anywhere). Sorted, 8.
  layout() {
    const grid = this.container, run = this.run;
    if (!run || this.isOverview) return;
    const n = run.n_heads;
    let per = Math.min(8, n), lines = 1;
    if (this.byPosition) {
      // hidden (no width yet): one line a layer until the panel shows
      const fit = grid.clientWidth ? this.fit(grid.clientWidth) : n;
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
    if (!this.run || !moves[ev.key] || ev.target === this.ov?.canvas) return;
    ev.preventDefault();
    const cells = [...this.container.querySelectorAll(".head-cell")].filter((c) => !c.hidden);
    if (!cells.length) return;
    const at = Math.max(0, cells.findIndex((c) => c.classList.contains("selected")));
    let next;
    if (this.byPosition) {
      const [dl, dh] = moves[ev.key];
      const cur = cells[at].dataset;
      const layer = Math.max(0, Math.min(this.run.n_layers - 1, Number(cur.layer) + dl));
      const head = Math.max(0, Math.min(this.run.n_heads - 1, Number(cur.head) + dh));
      next = cells.find((c) => Number(c.dataset.layer) === layer && Number(c.dataset.head) === head);
    } else { // sorted: move through the order, a row of cols at a time up and down
      const cols = this.isOverview ? Math.max(1, Math.round(this.list.clientWidth / (cells[0].offsetWidth || 1))) : this.cols;
      const step = { ArrowLeft: -1, ArrowRight: 1, ArrowUp: -cols, ArrowDown: cols }[ev.key];
      next = cells[Math.max(0, Math.min(cells.length - 1, at + step))];
    }
    if (!next) return;
    next.focus();
    this.onSelect(Number(next.dataset.layer), Number(next.dataset.head));
  }

  // One head's thumbnail button: its canvas, entropy label and badges.
  cell(s, run, cls = "head-cell") {
    const kv = this.kv;
    const canvas = el("canvas", { width: THUMB, height: THUMB });
    const badges = el("span", { class: "badges" });
    fillBadges(badges, s, this.rowsOf(run), !this.sinks.common);
    const cell = el("button", {
      type: "button", class: cls,
      title: describe(s, kv < run.n_heads ? Math.floor(s.head / (run.n_heads / kv)) : null, run),
      dataset: { testid: "head-cell", layer: String(s.layer), head: String(s.head),
                 ...(s.keys_90 === undefined ? {} : { keys90: fmt(s.keys_90, 1) }) },
      tabindex: "-1",
      onclick: () => this.onSelect(s.layer, s.head),
    }, canvas, el("span", { class: "lbl" }), badges);
    this.label(cell, s);
    this.canvases.set(`${s.layer}:${s.head}`, canvas);
    return cell;
  }

  render(run, sortKey, selected, model = null) {
    const t0 = performance.now(); // how long a render takes: data-render-ms (read by the many-heads test)
    const token = ++this.token; // a newer render cancels thumbnails still loading
    if (this.controller) this.controller.abort();
    this.controller = new AbortController();
    if (this.observer) this.observer.disconnect();
    this.observer = null;
    this.tiles = new Map(); // layer -> its thumbnails' tile (a promise), for the overview's list
    this.container.replaceChildren();
    this.container.style.gridTemplateColumns = "";
    this.canvases.clear();
    Object.assign(this, { run, sortKey, model });
    this.markSource(run);
    this.selected = { layer: selected.layer, head: selected.head };
    const n = this.rowsOf(run);
    // grouped-query attention: query heads that share one K/V head stand together
    const kv = this.kv = model ? model.n_kv_heads : run.n_heads;
    const group = this.group = run.n_heads / kv;
    this.sinks = sinkCount(this.scoresOf(run), n);
    this.showNote();
    this.widen(run);
    this.isOverview = this.wantsOverview(run, group);
    this.container.dataset.mode = this.isOverview ? "overview" : "thumbnails";
    if (this.isOverview) {
      this.byPosition = false;
      this.renderOverview(run, sortKey);
      this.container.dataset.renderMs = fmt(performance.now() - t0, 1);
      return;
    }
    const byPosition = this.byPosition = sortKey === "position";
    const scores = byPosition ? this.scoresOf(run).slice() : sortHeads(this.scoresOf(run), sortKey);
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
      const start = byPosition && kv < run.n_heads && s.head % group === 0 && s.head > 0;
      const cell = this.cell(s, run, start ? "head-cell kv-start" : "head-cell");
      this.applyFilter(cell, s);
      this.container.append(cell);
    }
    this.layout(); // cells never narrower than a readable thumbnail: layers wrap, tall grids scroll down
    this.select(selected.layer, selected.head);
    this.container.dataset.renderMs = fmt(performance.now() - t0, 1);
    this.loadThumbnails(run, token, this.controller.signal)
      .catch((err) => token === this.token && !isAbort(err) && this.onError(err));
  }

  // a head the filter leaves out: faded where the grid is by position, gone where it is sorted
  applyFilter(cell, s) {
    const ok = passes(this.filter, s, this.rowsOf(this.run), !this.sinks.common);
    cell.classList.toggle("filtered-out", !ok && this.byPosition);
    cell.hidden = !ok && !this.byPosition;
  }

  // sinks too common to badge: said once, under the grid
  showNote() {
    if (!this.note) return;
    const { count, common } = this.sinks;
    this.note.textContent = common ? t("x.ov.sinks_common", { n: count, total: this.scoresOf(this.run).length }) : "";
    this.note.hidden = !common;
  }

  // ---- the overview: every head one cell, and a list of the heads the sort and filter pick ----------

  renderOverview(run, sortKey) {
    if (!this.ov) {
      this.ov = new HeadOverview({ onOpen: (layer, head) => this.onSelect(layer, head), describe: (layer, head) => this.speak(layer, head) });
    }
    this.listHead = el("div", { class: "list-head" });
    this.list = el("div", { class: "head-list", dataset: { testid: "head-list" } });
    this.container.append(this.ov.element, this.listHead, this.list);
    this.paintOverview();
    this.ov.select(this.selected.layer, this.selected.head);
    this.ov.draw(Math.floor(this.container.clientWidth));
    this.fillList(LIST_STEP);
  }

  // the score the overview colours by: the sort's, entropy where the sort is by position
  overviewKey() {
    return this.sortKey === "position" ? "entropy" : this.sortKey;
  }

  paintOverview() {
    const run = this.run, key = this.overviewKey(), n = this.rowsOf(run);
    const values = new Float64Array(run.n_layers * run.n_heads).fill(NaN);
    const shown = new Uint8Array(values.length);
    const marks = new Map(); // head index -> the badges its cell shows
    for (const s of this.scoresOf(run)) {
      const i = s.layer * run.n_heads + s.head;
      values[i] = s[key] ?? NaN;
      shown[i] = passes(this.filter, s, n, !this.sinks.common) ? 1 : 0;
      const names = badgesFor(s, n, !this.sinks.common).map(([name]) => name);
      if (names.length) marks.set(i, names);
    }
    this.ov.set({ layers: run.n_layers, heads: run.n_heads, values, group: this.group, key,
                  shown: (layer, head) => shown[layer * run.n_heads + head] === 1,
                  marks: (layer, head) => marks.get(layer * run.n_heads + head) || [] });
  }

  // "layer L head H, entropy 0.42, badges P": what the live region says of the cursor's head
  speak(layer, head) {
    const run = this.run, key = this.overviewKey();
    const heads = this.scoresOf(run);
    const at = heads[layer * run.n_heads + head]; // the server lists heads by layer, then head
    const s = at && at.layer === layer && at.head === head ? at : heads.find((h) => h.layer === layer && h.head === head);
    const names = badgesFor(s, this.rowsOf(run)).map(([name]) => t(`x.badge.${name}`));
    return t("x.ov.cell", { layer, head, score: t(`x.sort.${key}`), value: key === "induction" ? inductionText(s, 2, run) : scoreText(s[key], 2) }) +
      (names.length ? t("x.ov.cell_badges", { badges: names.join(", ") }) : "");
  }

  // The heads the list shows: the selected head's layer where the grid is by position and unfiltered
  // (its neighbours), else the filter's heads in the sort's order, `count` of them.
  listed() {
    const run = this.run, n = this.rowsOf(run);
    if (this.sortKey === "position" && this.filter === "all") {
      return { heads: this.scoresOf(run).filter((s) => s.layer === this.selected.layer), total: run.n_heads, layer: this.selected.layer };
    }
    const picked = this.scoresOf(run).filter((s) => passes(this.filter, s, n, !this.sinks.common));
    return { heads: this.sortKey === "position" ? picked : sortHeads(picked, this.sortKey), total: picked.length, layer: null };
  }

  fillList(count) {
    const run = this.run;
    const { heads, total, layer } = this.listed();
    this.listCount = count;
    this.listLayer = layer;
    if (this.observer) this.observer.disconnect();
    this.canvases.clear();
    const shown = heads.slice(0, count);
    this.listHead.replaceChildren(el("span", { text: layer !== null ? t("x.ov.list_layer", { layer, n: total })
      : t("x.ov.list", { shown: shown.length, n: total }) }));
    if (shown.length < heads.length) {
      this.listHead.append(el("button", { type: "button", class: "more", text: t("x.ov.more", { n: Math.min(LIST_STEP, heads.length - shown.length) }),
                                          dataset: { testid: "head-list-more" }, onclick: () => this.fillList(count + LIST_STEP) }));
    }
    this.list.replaceChildren(...shown.map((s) => this.cell(s, run)));
    this.select(this.selected.layer, this.selected.head, false);
    // thumbnails for the cells in view only: a layer's tile when the first of its cells shows
    const token = this.token, signal = this.controller.signal;
    this.observer = new IntersectionObserver((entries) => {
      for (const e of entries) {
        if (!e.isIntersecting) continue;
        this.observer.unobserve(e.target);
        this.thumb(run, Number(e.target.dataset.layer), Number(e.target.dataset.head), token, signal);
      }
    }, { root: null, rootMargin: "100px" });
    for (const c of this.list.children) this.observer.observe(c);
  }

  thumb(run, layer, head, token, signal) {
    const n = run.tokens.length;
    if (!this.tiles.has(layer)) {
      this.tiles.set(layer, this.getTile(run.run_id, { layer, q0: 0, q1: n, k0: 0, k1: n, size: THUMB, pool: "max", format: "bin" }, { signal }));
    }
    this.tiles.get(layer).then((tile) => {
      if (token !== this.token) return;
      const canvas = this.canvases.get(`${layer}:${head}`);
      if (canvas) drawThumb(canvas, tile, head);
      this.container.dataset.thumbs = String(this.tiles.size);
    }).catch((err) => {
      this.tiles.delete(layer);
      if (token === this.token && !isAbort(err)) this.onError(err);
    });
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
  // tooltip and badges, and the overview's colours.
  annotate(run) {
    this.sinks = sinkCount(this.scoresOf(run), this.rowsOf(run));
    this.showNote();
    if (this.isOverview) {
      this.paintOverview();
      this.ov.draw();
    }
    const group = this.kv < run.n_heads ? run.n_heads / this.kv : 1;
    const byKey = new Map(this.scoresOf(run).map((s) => [`${s.layer}:${s.head}`, s]));
    for (const cell of this.container.querySelectorAll(".head-cell")) {
      const s = byKey.get(`${cell.dataset.layer}:${cell.dataset.head}`);
      cell.title = describe(s, group > 1 ? Math.floor(s.head / group) : null, run);
      this.label(cell, s);
      fillBadges(cell.querySelector(".badges"), s, this.rowsOf(run), !this.sinks.common);
      if (!this.isOverview) this.applyFilter(cell, s);
      if (s.keys_90 !== undefined) cell.dataset.keys90 = fmt(s.keys_90, 1);
    }
  }

  // The grid as one picture: PNG from a canvas, or SVG with each thumbnail embedded (the overview: its map).
  async exportImage(format) {
    if (this.isOverview) {
      const c = this.ov.canvas;
      if (format === "svg") {
        const w = c.clientWidth, h = c.clientHeight;
        return new Blob([`<svg xmlns="http://www.w3.org/2000/svg" width="${w}" height="${h}"><image width="${w}" height="${h}" href="${c.toDataURL()}"/></svg>`], { type: "image/svg+xml" });
      }
      return new Promise((resolve) => c.toBlob(resolve, "image/png"));
    }
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

  select(layer, head, follow = true) {
    this.selected = { layer, head };
    if (this.isOverview && follow) {
      this.ov.select(layer, head);
      // by position, the list shows the selected head's layer: a new layer, a new list
      if (this.sortKey === "position" && this.filter === "all" && this.listLayer !== layer) this.fillList(LIST_STEP);
    }
    const cells = this.container.querySelectorAll(".head-cell");
    for (const cell of cells) {
      const on = Number(cell.dataset.layer) === layer && Number(cell.dataset.head) === head;
      cell.classList.toggle("selected", on);
      cell.setAttribute("aria-pressed", on ? "true" : "false");
      cell.tabIndex = on ? 0 : -1; // one tab stop; arrow keys move inside the grid
    }
    if (this.isOverview && cells.length && ![...cells].some((c) => c.tabIndex === 0)) cells[0].tabIndex = 0;
  }
}
