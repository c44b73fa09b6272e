// One message catalogue per language (static/i18n/en.js, static/i18n/zh.js), shared by
// Learn and the explorer. Keys are flat ("ids.note.adjacent"); "{name}" is a placeholder.
// The language comes from ?lang=zh|en, else from the reader's last choice (localStorage, so
// it carries across pages), else from the browser; switching rewrites every [data-i18n*] node,
// the nav links' ?lang= and calls each registered painter, without a reload.

import en from "../i18n/en.js";
import { isEmbedded, search, setSearch } from "./page.js";
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
  const fromUrl = new URLSearchParams(search()).get("lang");
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
  if (isEmbedded()) return; // an embedded explorer has no site around it to link to
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
  const params = new URLSearchParams(search());
  params.set("lang", next);
  setSearch(params);
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

// A server error's code, when the catalogue says it: {code, key, params} (null: no code, or one the
// catalogue does not know). `err` is what api.js throws (an ApiError: status, message, code, params)
// or any object with a code and params; the params are the values the catalogue's text names.
export function serverError(err) {
  const code = err && typeof err === "object" && typeof err.code === "string" ? err.code : null;
  const key = code ? `err.${code}` : null;
  if (!key || catalogues.en[key] === undefined) return null;
  const params = err.params && typeof err.params === "object" ? err.params : {};
  return { code, key, params };
}

// A parameter as the catalogue's sentence shows it: nothing for null; character and cell counts with
// thousands separators, as the server's English says them (token counts, ids and positions stay plain);
// a list's strings in the language's own quotes.
const COUNTS = new Set(["chars", "read_chars", "total_chars", "cells"]);
function shown(value, key = "") {
  if (value === null || value === undefined) return "";
  const quote = (v) => (current === "zh" ? `“${v}”` : `"${v}"`);
  if (Array.isArray(value)) return value.map((v) => (typeof v === "string" ? quote(v) : String(v))).join(current === "zh" ? "、" : ", ");
  if (typeof value === "number" && COUNTS.has(key) && Math.abs(value) >= 1000) return value.toLocaleString("en-US");
  return String(value);
}

// What went wrong, in the reader's language. `err` is an error (an ApiError from api.js, with its
// code and params) or a plain string, shown as it is (the page's own words, or untranslated).
// A server error is translated by its code; in English the server's own sentence, which says
// most, is shown as it is. A request that never reached the server (code "network") says so.
export function errorText(err) {
  if (err === null || err === undefined || err === "") return "";
  if (typeof err !== "object") return String(err);
  const message = String(err.message ?? "");
  const hit = serverError(err);
  if (hit && (current !== "en" || hit.code === "network" || !message)) {
    const vars = { message };
    for (const [k, v] of Object.entries(hit.params)) vars[k] = shown(v, k);
    return t(hit.key, vars);
  }
  return current === "en" || !message ? message : t("err.server", { message });
}
