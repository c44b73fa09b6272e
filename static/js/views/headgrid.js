// Every layer x head as a thumbnail, labelled with its entropy and badged by what the
// engine measured: previous-token, first-token (sink) and induction-like heads.
import { el, fmt } from "../dom.js";
import { getAttentionBin } from "../api.js";
import { rgb } from "./colour.js";

const THUMB = 48;
export const BADGES = [
  ["prev", "prev_token", 0.4, "previous-token head"],
  ["sink", "first_token", 0.6, "first-token (sink) head"],
  ["ind", "induction", 0.3, "induction-like head"],
];

function drawThumb(canvas, slice, head) {
  const size = slice.size ?? slice.n;
  canvas.width = size;
  canvas.height = size;
  const ctx = canvas.getContext("2d");
  const img = ctx.createImageData(size, size);
  const perHead = slice.size ? size * size : slice.causal ? (size * (size + 1)) / 2 : size * size;
  const base = head * perHead;
  let max = 1e-9;
  for (let i = 0; i < perHead; i++) max = Math.max(max, slice.data[base + i]);
  let idx = 0;
  for (let r = 0; r < size; r++) {
    for (let c = 0; c < size; c++) {
      const p = (r * size + c) * 4;
      const masked = slice.causal && c > r;
      let v = 0;
      if (!masked) {
        v = slice.size || !slice.causal ? slice.data[base + r * size + c] : slice.data[base + idx++];
      }
      const [R, G, B] = masked ? [222, 225, 230] : rgb(Math.sqrt(v / max));
      img.data[p] = R; img.data[p + 1] = G; img.data[p + 2] = B; img.data[p + 3] = 255;
    }
  }
  ctx.putImageData(img, 0, 0);
}

function badgesFor(score) {
  return BADGES.filter(([, key, threshold]) => score[key] !== null && score[key] >= threshold);
}

export class HeadGrid {
  constructor(container, onSelect) {
    this.container = container;
    this.onSelect = onSelect;
    this.canvases = new Map();
    this.token = 0;
  }

  render(run, sortKey, selected) {
    const token = ++this.token; // a newer render cancels thumbnails still loading
    this.container.replaceChildren();
    this.canvases.clear();
    const scores = run.heads.slice();
    const byPosition = sortKey === "position";
    if (!byPosition) {
      const sign = sortKey === "entropy" ? 1 : -1;
      scores.sort((a, b) => sign * ((a[sortKey] ?? -1) - (b[sortKey] ?? -1)));
    }
    const cols = byPosition ? run.n_heads : Math.min(8, run.n_heads);
    this.container.style.gridTemplateColumns = `${byPosition ? "2.2em " : ""}repeat(${cols}, minmax(0, 1fr))`;
    let lastLayer = -1;
    for (const s of scores) {
      if (byPosition && s.layer !== lastLayer) {
        this.container.append(el("span", { class: "row-label", text: `L${s.layer}` }));
        lastLayer = s.layer;
      }
      const canvas = el("canvas", { width: THUMB, height: THUMB });
      const badges = el("span", { class: "badges" });
      for (const [name, , , title] of badgesFor(s)) badges.append(el("b", { class: `badge ${name}`, text: name, title }));
      const cell = el("button", {
        type: "button", class: "head-cell",
        title: `layer ${s.layer} head ${s.head}\nentropy ${fmt(s.entropy, 2)} nats\nprevious-token ${fmt(s.prev_token, 2)}` +
               `\nfirst-token ${fmt(s.first_token, 2)}\ninduction ${s.induction === null ? "n/a (no repeats)" : fmt(s.induction, 2)}`,
        dataset: { testid: "head-cell", layer: String(s.layer), head: String(s.head) },
        onclick: () => this.onSelect(s.layer, s.head),
      }, canvas, badges, el("span", { class: "lbl", text: byPosition ? fmt(s.entropy, 2) : `L${s.layer}H${s.head} ${fmt(s.entropy, 1)}` }));
      this.container.append(cell);
      this.canvases.set(`${s.layer}:${s.head}`, canvas);
    }
    this.select(selected.layer, selected.head);
    this.loadThumbnails(run, token);
  }

  async loadThumbnails(run, token) {
    for (let layer = 0; layer < run.n_layers; layer++) {
      const slice = await getAttentionBin(run.run_id, layer, null, run.tokens.length > THUMB ? THUMB : null);
      if (token !== this.token) return;
      for (let head = 0; head < run.n_heads; head++) {
        const canvas = this.canvases.get(`${layer}:${head}`);
        if (canvas) drawThumb(canvas, slice, head);
      }
    }
  }

  select(layer, head) {
    for (const cell of this.container.querySelectorAll(".head-cell")) {
      cell.classList.toggle("selected", Number(cell.dataset.layer) === layer && Number(cell.dataset.head) === head);
    }
  }
}
