// Every head of a model as one cell of one canvas: layers down, heads across, coloured by a score
// (issue 37 §5). A model of 270 to 5,000 heads has no room for a thumbnail each; this map has, at any
// width: its columns are the heads of a layer, so a K/V group's header always sits over its heads.
// Click a cell to open that head; arrow keys move a cursor (announced as "layer L head H, score"),
// Enter opens it. One canvas, not thousands of DOM nodes; the live region beside it speaks for it.
import { el, fmt } from "../dom.js";
import { hexRGB, maskColours, rgb } from "./colour.js";
import { t } from "../i18n.js";

// scores where the low end comes first (sort "low first"): drawn dark, like the top of the others
export const LOW_FIRST = new Set(["entropy", "keys_90"]);
const GUTTER = 30; // px on the left for the layer labels
const MIN_ROW = 3, MAX_ROW = 16, MAX_HEIGHT = 620; // px a layer's row, and the map's height at most

export class HeadOverview {
  // onOpen(layer, head): a cell clicked or Enter pressed; describe(layer, head): what the live region says
  constructor({ onOpen, describe }) {
    this.onOpen = onOpen;
    this.describe = describe;
    this.canvas = el("canvas", {
      class: "ov-canvas", tabindex: "0", role: "application", "aria-roledescription": t("x.ov.role"),
      dataset: { testid: "head-overview" },
      onclick: (ev) => this.click(ev), onkeydown: (ev) => this.key(ev),
      onfocus: () => this.draw(), onblur: () => this.draw(),
      onmousemove: (ev) => this.hover(ev), onmouseleave: () => { this.canvas.title = ""; },
    });
    this.status = el("span", { class: "sr-only", role: "status", "aria-live": "polite", dataset: { testid: "overview-status" } });
    this.legend = el("p", { class: "ov-legend", dataset: { testid: "overview-legend" } });
    this.element = el("div", { class: "head-overview" }, this.canvas, this.status, this.legend);
    this.cursor = { layer: 0, head: 0 };
    this.selected = { layer: 0, head: 0 };
  }

  // values: Float64Array of layers x heads (NaN: still owed); shown(layer, head): passes the filter;
  // marks(layer, head): the badges the grid shows on that head (a corner of the cell in the badge's
  // colour); group: query heads a K/V head; key: the score's name (legend, direction)
  set({ layers, heads, values, shown, marks, group, key }) {
    Object.assign(this, { layers, heads, values, shown, marks, group, score: key });
    let lo = Infinity, hi = -Infinity;
    for (const v of values) if (!Number.isNaN(v)) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
    this.lo = lo; this.hi = hi;
    this.legend.textContent = lo <= hi
      ? t(LOW_FIRST.has(key) ? "x.ov.legend_low" : "x.ov.legend_high", { score: t(`x.sort.${key}`), lo: fmt(lo, 2), hi: fmt(hi, 2) })
      : t("x.scores.pending");
    this.canvas.setAttribute("aria-label", t("x.ov.aria", { layers, heads, n: layers * heads }));
  }

  // the cell size for the width the panel gives it
  measure(width) {
    const header = this.group > 1 ? 16 : 10;
    const cw = Math.max(1, (width - GUTTER) / this.heads);
    const ch = Math.max(MIN_ROW, Math.min(MAX_ROW, Math.round(cw), Math.floor((MAX_HEIGHT - header) / this.layers)));
    return { cw, ch, header, width, height: header + ch * this.layers };
  }

  draw(width = this.width) {
    if (!this.values || !width) return;
    const t0 = performance.now();
    this.width = width;
    const g = this.geom = this.measure(width);
    const dpr = window.devicePixelRatio || 1, c = this.canvas;
    c.style.width = `${g.width}px`; c.style.height = `${g.height}px`;
    c.width = Math.round(g.width * dpr); c.height = Math.round(g.height * dpr);
    const ctx = c.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    const style = getComputedStyle(c);
    const fg = style.color, muted = style.getPropertyValue("--muted").trim() || "#666";
    const accent = "#d6336c"; // the heatmap's selected-cell pink: it stands out on white and on deep blue
    const masked = hexRGB(maskColours().fill || "#dddddd");
    // the cells: one rectangle each, a pale one where the filter leaves the head out
    const span = this.hi - this.lo || 1, low = LOW_FIRST.has(this.score);
    const gap = g.cw >= 5 ? 1 : 0;
    const marked = [];
    for (let L = 0; L < this.layers; L++) {
      for (let h = 0; h < this.heads; h++) {
        const v = this.values[L * this.heads + h];
        let col = Number.isNaN(v) ? masked : rgb(0.08 + 0.92 * (low ? (this.hi - v) / span : (v - this.lo) / span));
        if (!this.shown(L, h)) col = col.map((x) => 235 + (x - 235) * 0.12);
        ctx.fillStyle = `rgb(${col.map(Math.round).join(",")})`;
        const x = GUTTER + h * g.cw, y = g.header + L * g.ch;
        ctx.fillRect(x, y, Math.max(1, g.cw - gap), Math.max(1, g.ch - (g.ch >= 6 ? 1 : 0)));
        marked.push(...this.marks(L, h).map((name) => [x, y, name]));
      }
    }
    // badged heads: a corner in the badge's colour (P, S, I side by side where a head has more than one)
    const root = getComputedStyle(document.documentElement);
    const side = Math.max(2, Math.min(6, Math.floor(Math.min(g.cw, g.ch) / 2)));
    const seen = new Map();
    for (const [x, y, name] of marked) {
      const k = `${x},${y}`, i = seen.get(k) || 0;
      seen.set(k, i + 1);
      ctx.fillStyle = root.getPropertyValue(`--${name}`).trim() || "#c00";
      ctx.fillRect(x + g.cw - gap - side * (i + 1), y, side, side);
    }
    ctx.font = `10px ${style.fontFamily}`;
    ctx.textBaseline = "middle";
    // layer labels, as often as they fit
    ctx.fillStyle = muted;
    ctx.textAlign = "right";
    const every = Math.max(1, Math.ceil(12 / g.ch));
    const step = [1, 2, 5, 10, 20, 50].find((s) => s >= every) || every;
    for (let L = 0; L < this.layers; L += step) ctx.fillText(`L${L}`, GUTTER - 4, g.header + (L + 0.5) * g.ch);
    // K/V groups: a bracket over each group's columns, its number where it fits; else head numbers
    ctx.textAlign = "center";
    if (this.group > 1) {
      const kv = this.heads / this.group, w = g.cw * this.group;
      const label = (k) => (w >= 52 ? t("x.ov.kv", { g: k }) : w >= 14 ? String(k) : "");
      ctx.strokeStyle = muted; ctx.lineWidth = 1;
      for (let k = 0; k < kv; k++) {
        const x0 = GUTTER + k * w + 1, x1 = GUTTER + (k + 1) * w - 2;
        ctx.beginPath(); ctx.moveTo(x0, g.header - 2); ctx.lineTo(x1, g.header - 2); ctx.stroke();
        const text = label(k);
        if (text && (k % Math.max(1, Math.ceil(24 / w)) === 0)) ctx.fillText(text, (x0 + x1) / 2, 7);
      }
    } else {
      const hstep = [1, 2, 4, 8, 16, 32].find((s) => s * g.cw >= 16) || 64;
      for (let h = 0; h < this.heads; h += hstep) ctx.fillText(String(h), GUTTER + (h + 0.5) * g.cw, 5);
    }
    // the selected head, and the keyboard's cursor while the map has the focus
    const box = ({ layer, head }, colour, width, dash) => {
      ctx.setLineDash(dash); ctx.strokeStyle = colour; ctx.lineWidth = width;
      const pad = width / 2 + (g.cw < 6 ? 1 : 0);
      ctx.strokeRect(GUTTER + head * g.cw - pad, g.header + layer * g.ch - pad, g.cw + 2 * pad - gap, g.ch + 2 * pad);
      ctx.setLineDash([]);
    };
    box(this.selected, accent, 2, []);
    if (document.activeElement === c) box(this.cursor, fg, 1.5, [3, 2]);
    Object.assign(c.dataset, {
      layers: String(this.layers), heads: String(this.heads), left: String(GUTTER), top: String(g.header),
      cellW: String(g.cw), cellH: String(g.ch), cursor: `${this.cursor.layer}:${this.cursor.head}`,
      drawnMs: fmt(performance.now() - t0, 1), drawnAt: String(performance.now()),
    });
  }

  at(ev) {
    const g = this.geom, r = this.canvas.getBoundingClientRect();
    const head = Math.floor((ev.clientX - r.left - GUTTER) / g.cw), layer = Math.floor((ev.clientY - r.top - g.header) / g.ch);
    return head >= 0 && head < this.heads && layer >= 0 && layer < this.layers ? { layer, head } : null;
  }

  click(ev) {
    const cell = this.at(ev);
    if (!cell) return;
    this.moveTo(cell);
    this.onOpen(cell.layer, cell.head);
  }

  hover(ev) {
    const cell = this.at(ev);
    this.canvas.title = cell ? this.describe(cell.layer, cell.head) : "";
  }

  moveTo({ layer, head }) {
    this.cursor = { layer, head };
    this.status.textContent = this.describe(layer, head);
    this.draw();
  }

  select(layer, head) {
    this.selected = { layer, head };
    this.cursor = { layer, head };
    this.draw();
  }

  // arrows: a head left or right, a layer up or down; Home / End: the layer's first and last head
  // (with Ctrl: the model's); Page Up / Down: 10 layers; Enter or Space opens the head under the cursor
  key(ev) {
    const { layer, head } = this.cursor, last = this.heads - 1;
    const moves = {
      ArrowLeft: [layer, head - 1], ArrowRight: [layer, head + 1], ArrowUp: [layer - 1, head], ArrowDown: [layer + 1, head],
      PageUp: [layer - 10, head], PageDown: [layer + 10, head],
      Home: ev.ctrlKey ? [0, 0] : [layer, 0], End: ev.ctrlKey ? [this.layers - 1, last] : [layer, last],
    };
    if (ev.key === "Enter" || ev.key === " ") {
      ev.preventDefault();
      this.onOpen(layer, head);
      return;
    }
    if (!moves[ev.key]) return;
    ev.preventDefault();
    ev.stopPropagation(); // the grid's own arrow keys are for thumbnails
    const [L, h] = moves[ev.key];
    this.moveTo({ layer: Math.max(0, Math.min(this.layers - 1, L)), head: Math.max(0, Math.min(last, h)) });
  }
}
