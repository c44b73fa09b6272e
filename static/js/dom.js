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

// A token as a person should read it: spaces and newlines made visible.
export function showToken(s) {
  return String(s).replace(/ /g, "␣").replace(/\n/g, "⏎").replace(/\t/g, "⇥") || "∅";
}

export function fmt(p, digits = 3) {
  return Number(p).toFixed(digits);
}
