// One message catalogue per language (static/i18n/en.js, static/i18n/zh.js), shared by
// Learn and the explorer. Keys are flat ("l3.note.adjacent"); "{name}" is a placeholder.
// The language comes from ?lang=zh|en, else from the reader's last choice (localStorage, so
// it carries across pages), else from the browser; switching rewrites every [data-i18n*] node,
// the nav links' ?lang= and calls each registered painter, without a reload.

import en from "../i18n/en.js";
import zh from "../i18n/zh.js";

export const LANGUAGES = ["en", "zh"];
const catalogues = { en, zh };
const painters = new Set();
let current = "en";
const STORE = "attnscope.lang";

function stored() {
  try {
    return localStorage.getItem(STORE);
  } catch {
    return null; // storage blocked (private mode, file://): the URL still carries the choice
  }
}

function remember(l) {
  try {
    localStorage.setItem(STORE, l);
  } catch {
    // storage blocked: the nav links' ?lang= still carry the choice
  }
}

export function pickLanguage() {
  const fromUrl = new URLSearchParams(location.search).get("lang");
  if (LANGUAGES.includes(fromUrl)) return fromUrl;
  const saved = stored();
  if (LANGUAGES.includes(saved)) return saved;
  const wanted = navigator.languages && navigator.languages.length ? navigator.languages : [navigator.language || "en"];
  for (const l of wanted) {
    const base = String(l).toLowerCase().split("-")[0];
    if (LANGUAGES.includes(base)) return base;
  }
  return "en";
}

export const lang = () => current;

// The text for `key` in the current language, placeholders filled from `vars`. A count of one
// (vars.n === 1) reads the key's singular form, "key.one", where the catalogue has one.
export function t(key, vars = {}) {
  if (vars.n === 1 && catalogues[current]?.[`${key}.one`] !== undefined) key = `${key}.one`;
  const s = catalogues[current]?.[key] ?? catalogues.en?.[key];
  if (s === undefined) return key;
  return s.replace(/\{(\w+)\}/g, (m, k) => (k in vars ? String(vars[k]) : m));
}

// Sentences made into one paragraph: English puts a space between them, Chinese none (a
// sentence there ends in 。 and the next follows at once).
export function sentences(parts) {
  return parts.filter((x) => x).join(current === "zh" ? "" : " ");
}

export function has(key) {
  return key in (catalogues[current] || {});
}

// Nodes marked in the templates: data-i18n (text), data-i18n-placeholder, -title, -aria.
export function applyStatic(root = document) {
  for (const n of root.querySelectorAll("[data-i18n]")) n.textContent = t(n.dataset.i18n);
  for (const n of root.querySelectorAll("[data-i18n-placeholder]")) n.placeholder = t(n.dataset.i18nPlaceholder);
  for (const n of root.querySelectorAll("[data-i18n-title]")) n.title = t(n.dataset.i18nTitle);
  for (const n of root.querySelectorAll("[data-i18n-aria]")) n.setAttribute("aria-label", t(n.dataset.i18nAria));
}

// fn(lang) runs on every switch (it may return a promise); returns the unregister function.
export function onLanguage(fn) {
  painters.add(fn);
  return () => painters.delete(fn);
}

// The site's own links (the nav) carry the language, so it follows the reader to the next page.
function linkLanguage() {
  for (const a of document.querySelectorAll("header.top nav a[href^='/']")) {
    const url = new URL(a.getAttribute("href"), location.origin);
    url.searchParams.set("lang", current);
    a.setAttribute("href", `${url.pathname}${url.search}${url.hash}`);
  }
}

function mark() {
  linkLanguage();
  document.documentElement.lang = current === "zh" ? "zh-CN" : "en";
  document.documentElement.dataset.lang = current;
  if (document.body.dataset.titleKey) document.title = t(document.body.dataset.titleKey);
}

export async function setLanguage(next) {
  if (!LANGUAGES.includes(next)) return;
  current = next;
  remember(next);
  const params = new URLSearchParams(location.search);
  params.set("lang", next);
  history.replaceState(history.state, "", `${location.pathname}?${params}`);
  mark();
  applyStatic();
  document.documentElement.dataset.painted = "";
  await Promise.all([...painters].map(async (fn) => {
    try {
      await fn(next);
    } catch (err) {
      console.warn("repaint failed", err);
    }
  }));
  document.documentElement.dataset.painted = next;
}

// plotly's own words (mode bar, notices) as a "zh-CN" locale built from the "plotly.*" keys;
// plotConfig() picks the locale of the current language.
function registerPlotlyLocale() {
  if (!window.Plotly) return;
  const dictionary = {};
  for (const [key, english] of Object.entries(catalogues.en)) {
    if (key.startsWith("plotly.")) dictionary[english] = catalogues.zh[key];
  }
  window.Plotly.register({ moduleType: "locale", name: "zh-CN", dictionary, format: {} });
}

export const plotlyLocale = () => (current === "zh" ? "zh-CN" : "en");

// Pick the language, translate the page, wire the switch (the catalogues are modules: no wait).
export async function initLanguage() {
  current = pickLanguage();
  registerPlotlyLocale();
  mark();
  applyStatic();
  const button = document.getElementById("lang");
  if (button) button.addEventListener("click", () => setLanguage(current === "en" ? "zh" : "en"));
  document.documentElement.dataset.painted = current;
}

// The server's messages a reader can meet on these pages, by pattern; the groups fill {1}, {2}.
const SERVER_ERRORS = [
  [/^(?:(?:body\.)?text: )?text is empty or only whitespace/, "err.empty"],
  [/^the prompt has (\d+) tokens, more than this model's limit of (\d+)/, "err.too_long"],
  [/^the prompt has at least (\d+) tokens, more than this model's limit of (\d+) \(counted in its first ([\d,]+) of ([\d,]+) characters/, "err.too_long_at_least_read"],
  [/^the prompt has at least (\d+) tokens, more than this model's limit of (\d+) \(from its length of ([\d,]+) characters alone/, "err.too_long_at_least_length"],
  [/^the prompt has at least (\d+) tokens, more than this model's limit of (\d+)/, "err.too_long_at_least"],
  [/^the prompt has ([\d,]+) characters, more than this model reads for its limit of (\d+) tokens/, "err.too_long_chars"],
  [/^run expired/, "err.expired"],
  [/^unknown run/, "err.unknown_run"],
  [/^model '([^']*)' is busy/, "err.busy"],
  [/^token id (-?\d+) is out of range: the vocabulary has ids 0\.\.(\d+)/, "err.bad_id"],
  [/^the prompt has (\d+) tokens; timing takes at most (\d+)/, "err.timing_long"],
  [/^(Failed to fetch|NetworkError|Load failed)/, "err.network"],
  [/^the model is not loaded yet/, "err.loading"],
  [/^unknown model '([^']*)'/, "err.unknown_model"],
  [/^this prompt's run would keep ([\d,]+ MiB) \(([\d,]+) tokens; its forward peaks near ([\d,]+ MiB)\); the run cache holds at most ([\d,]+ MiB)/, "err.run_too_big"],
  [/^this prompt's forward would need ([\d,]+ MiB) at its peak; forwards in flight may use at most ([\d,]+ MiB)/, "err.forward_too_big"],
  [/^this prompt's forward would need ([\d,]+ MiB); the server is busy/, "err.forward_busy"],
  // the Patch tool's
  [/^(?:answer|wrong) (.+) is (\d+) tokens for this model \((.*)\); it must be exactly one token \(here the leading space/, "err.patch_space"],
  [/^(?:answer|wrong) (.+) is (\d+) tokens for this model \((.*)\); it must be exactly one token/, "err.patch_one"],
  [/^the clean prompt has (\d+) tokens and the corrupted one (\d+)/, "err.patch_lengths"],
  [/^answer and wrong are the same token \((.*)\): the metric would always be 0/, "err.patch_same_token"],
  [/^both prompts give the same metric \(logit\(answer\) - logit\(wrong\) = (\S+) and (\S+)\)/, "err.patch_same"],
  [/^patching these prompts takes (\d+) patched forwards of (\d+) tokens \(about (\d+) TFLOP\), more than this server's limit of (\d+)/, "err.patch_flops"],
];

// Which known server message this is: its catalogue key and the values its pattern read (null: none).
export function serverError(message) {
  const msg = String(message || "");
  for (const [pattern, key] of SERVER_ERRORS) {
    const m = msg.match(pattern);
    if (m) return { key, values: m.slice(1) };
  }
  return null;
}

// A server message in the reader's language: a known message is translated; any other keeps
// the server's words after a translated lead (English mode shows the server's words as they are).
export function errorText(message) {
  const msg = String(message || "");
  for (const [pattern, key] of SERVER_ERRORS) {
    // the server writes English: in English its own words, which say most, are shown as they are
    if (current === "en" && key !== "err.network") continue;
    const m = msg.match(pattern);
    if (m) return t(key, Object.fromEntries(m.slice(1).map((v, k) => [String(k + 1), v])));
  }
  return current === "en" ? msg : t("err.server", { message: msg });
}
