// The prompt as token chips: display text, ID below, character span on hover.
// A long prompt's strip is virtualised: every chip's width is measured once (canvas text
// metrics, no DOM), the chips are laid out into lines in JS, and only the lines in view
// (plus a few above and below) exist in the DOM, so 32k tokens do not freeze the page.
import { el, showToken } from "../dom.js";
import { t as tr } from "../i18n.js";

export const VIRTUAL_FROM = 1000; // a strip with more tokens than this renders only the lines in view
const OVERSCAN = 4; // lines drawn above and below the visible ones, so a quick scroll shows no gap

const strips = new WeakMap(); // container -> its VirtualStrip, while the strip is virtual

function chipFor(t, onSelect) {
  const kind = t.special ? " special" : t.partial ? " partial" : "";
  const what = t.special ? tr("x.chip.special")
    : t.partial && t.start === t.end ? tr("x.chip.bytes")
    : t.partial ? tr("x.chip.chars_then_bytes", { start: t.start, end: t.end })
    : tr("x.chip.chars", { start: t.start, end: t.end });
  return el("button", {
    type: "button",
    class: `token${kind}`,
    title: tr("x.chip.title", { i: t.index, id: t.id, what }),
    dataset: { testid: "token", index: String(t.index) },
    onclick: () => onSelect(t.index),
  },
  el("span", { class: "t", text: showToken(t.text) }),
  el("span", { class: "id", text: String(t.id) }));
}

export function renderTokens(container, run, onSelect) {
  const old = strips.get(container);
  if (old) old.destroy();
  strips.delete(container);
  container.replaceChildren();
  container.classList.remove("virtual");
  container.dataset.total = String(run.tokens.length);
  if (run.tokens.length > VIRTUAL_FROM) {
    strips.set(container, new VirtualStrip(container, run.tokens, onSelect));
    return;
  }
  for (const t of run.tokens) container.append(chipFor(t, onSelect));
}

export function markSelected(container, pos) {
  const strip = strips.get(container);
  if (strip) {
    strip.select(pos);
    return;
  }
  for (const chip of container.querySelectorAll(".token")) {
    chip.classList.toggle("selected", Number(chip.dataset.index) === pos);
  }
  const current = container.querySelector(".token.selected");
  if (current) current.scrollIntoView({ block: "nearest", inline: "nearest" });
}

// Chip geometry read once from one real chip (fonts, padding, borders come from app.css).
function calibrate(container) {
  const probe = chipFor({ index: 0, id: 0, text: "M", start: 0, end: 1 }, () => {});
  const line = el("div", { class: "strip-line" }, probe);
  line.style.visibility = "hidden";
  container.append(line);
  const text = probe.querySelector(".t"), id = probe.querySelector(".id");
  const fontOf = (node) => { const s = getComputedStyle(node); return `${s.fontStyle} ${s.fontWeight} ${s.fontSize} ${s.fontFamily}`; };
  const canvas = document.createElement("canvas").getContext("2d");
  const measure = (font, s) => { canvas.font = font; return canvas.measureText(s).width; };
  const fonts = { text: fontOf(text), id: fontOf(id) };
  const inner = Math.max(text.getBoundingClientRect().width, id.getBoundingClientRect().width);
  const chip = probe.getBoundingClientRect();
  const geometry = {
    frame: chip.width - inner, // padding + borders
    height: chip.height,
    gap: parseFloat(getComputedStyle(line).columnGap) || 3,
    width: (s, tokenId) => Math.ceil(Math.max(measure(fonts.text, s), measure(fonts.id, String(tokenId))) + 1),
  };
  line.remove();
  return geometry;
}

class VirtualStrip {
  constructor(container, tokens, onSelect) {
    this.container = container;
    this.tokens = tokens;
    this.onSelect = onSelect;
    this.selected = -1;
    this.frame = 0;
    container.classList.add("virtual");
    this.spacer = el("div", { class: "strip-spacer" });
    this.window = el("div", { class: "strip-window" });
    container.append(this.spacer, this.window);
    this.geo = calibrate(container);
    this.lineH = this.geo.height + this.geo.gap;
    // every chip's width, once: the layout below only adds numbers
    const cache = new Map();
    this.widths = new Float32Array(tokens.length);
    tokens.forEach((t, i) => {
      const shown = showToken(t.text);
      const key = `${shown}\u0000${t.id}`;
      if (!cache.has(key)) cache.set(key, this.geo.frame + this.geo.width(shown, t.id));
      this.widths[i] = cache.get(key);
    });
    this.layout();
    this.onScroll = () => this.schedule();
    container.addEventListener("scroll", this.onScroll, { passive: true });
    this.observer = new ResizeObserver(() => {
      if (Math.abs(this.container.clientWidth - this.laidOutFor) < 1) return;
      this.layout();
      this.schedule();
    });
    this.observer.observe(container);
    this.paint();
  }

  destroy() {
    this.container.removeEventListener("scroll", this.onScroll);
    this.observer.disconnect();
    cancelAnimationFrame(this.frame);
    this.container.classList.remove("virtual");
  }

  // Greedy line breaking, like flex-wrap: lineStart[l] is the first token of line l.
  layout() {
    const width = Math.max(40, this.container.clientWidth - 2);
    this.laidOutFor = this.container.clientWidth;
    const starts = [0];
    let x = 0;
    for (let i = 0; i < this.widths.length; i++) {
      const w = Math.min(this.widths[i], width);
      if (x > 0 && x + w > width) {
        starts.push(i);
        x = 0;
      }
      x += w + this.geo.gap;
    }
    this.lineStart = Int32Array.from(starts);
    this.spacer.style.height = `${starts.length * this.lineH}px`;
    this.container.dataset.lines = String(starts.length);
    this.painted = null;
  }

  lineOf(i) {
    let lo = 0, hi = this.lineStart.length - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (this.lineStart[mid] <= i) lo = mid; else hi = mid - 1;
    }
    return lo;
  }

  schedule() {
    if (!this.frame) this.frame = requestAnimationFrame(() => { this.frame = 0; this.paint(); });
  }

  paint() {
    const lines = this.lineStart.length;
    const top = Math.floor(this.container.scrollTop / this.lineH);
    const shown = Math.ceil((this.container.clientHeight || 160) / this.lineH);
    const a = Math.max(0, top - OVERSCAN), b = Math.min(lines, top + shown + OVERSCAN + 1);
    if (this.painted && this.painted[0] === a && this.painted[1] === b) return;
    this.painted = [a, b];
    const rows = [];
    const maxW = Math.max(40, this.container.clientWidth - 2);
    for (let l = a; l < b; l++) {
      const row = el("div", { class: "strip-line" });
      row.style.top = `${l * this.lineH}px`;
      const end = l + 1 < lines ? this.lineStart[l + 1] : this.tokens.length;
      for (let i = this.lineStart[l]; i < end; i++) {
        const chip = chipFor(this.tokens[i], this.onSelect);
        chip.style.width = `${Math.min(this.widths[i], maxW)}px`;
        if (i === this.selected) chip.classList.add("selected");
        row.append(chip);
      }
      rows.push(row);
    }
    this.window.replaceChildren(...rows);
    this.container.dataset.from = String(this.lineStart[a] ?? 0);
    this.container.dataset.to = String(b < lines ? this.lineStart[b] : this.tokens.length);
  }

  // Mark one token and bring its line into view (only when it is out of view).
  select(pos) {
    this.selected = pos;
    if (pos < 0 || pos >= this.tokens.length) return;
    const y = this.lineOf(pos) * this.lineH;
    const box = this.container;
    if (y < box.scrollTop || y + this.lineH > box.scrollTop + box.clientHeight) {
      box.scrollTop = Math.max(0, y - (box.clientHeight - this.lineH) / 2);
    }
    this.painted = null;
    this.paint();
  }
}
