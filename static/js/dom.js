// Tiny DOM helpers. Text always goes in through textContent: token strings are
// untrusted and never become HTML.

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child);
  return node;
}

const SVG_NS = "http://www.w3.org/2000/svg";
export function svg(tag, attrs = {}) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "text") node.textContent = value;
    else node.setAttribute(key, value);
  }
  return node;
}

export const $ = (selector) => document.querySelector(selector);

// Plotly renders a few HTML-like tags (<b>, <br>, <a>) inside its own labels;
// escape them so a token such as "<br>" shows as itself.
export function plotlyText(s) {
  return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
}

// Characters that draw nothing or reorder what follows (controls, zero-width joiners and spaces, bidi
// overrides such as U+202E): a token made of them would be an empty chip, or would flip its neighbours.
const INVISIBLE = /[\p{Cc}\p{Cf}]/gu;
// A variation selector (U+FE0F asks for ❤️ rather than ❤) draws nothing without a character before it
// in the token, and a byte-level tokenizer often gives it a token of its own: shown as ‹U+FE0F› there.
const BARE_SELECTOR = /(?<![^\s\p{Cc}\p{Cf}\u{FE00}-\u{FE0F}\u{E0100}-\u{E01EF}])[\u{FE00}-\u{FE0F}\u{E0100}-\u{E01EF}]/gu;
const codePoint = (c) => `‹U+${c.codePointAt(0).toString(16).toUpperCase().padStart(4, "0")}›`;

// A token as a person should read it: spaces, newlines, tabs and invisible characters made visible
// (the latter as ‹U+200D›); a partial character's byte marker (‹e6 88›) is kept as it is.
export function showToken(s) {
  return String(s).split(/(‹[0-9a-f]{2}(?: [0-9a-f]{2})*›)/).map((part, i) => i % 2 ? part :
    part.replace(BARE_SELECTOR, codePoint).replace(/ /g, "␣").replace(/\n/g, "⏎").replace(/\t/g, "⇥")
      .replace(INVISIBLE, codePoint)).join("") || "∅";
}

export function fmt(p, digits = 3) {
  return Number(p).toFixed(digits);
}

// An error from a fetch (or any work) whose AbortSignal was aborted: replaced on purpose, not a failure.
export const isAbort = (err) => err && err.name === "AbortError";
