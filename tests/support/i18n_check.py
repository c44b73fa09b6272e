"""Is a page in Chinese mode free of English UI words? Shared by the Learn and explorer tests.

"English UI word" = a word of the English catalogue (static/i18n/en.js). Allowed in Chinese
mode: the technical terms the seed note itself writes in English (token, Embedding, Attention,
FFN, Causal Mask, d_model, hidden representation, residual stream, LM Head, logits, …), math
symbols, the product and model names, and token text — words the page shows as tokens (tick
labels it sets, prompts, cells of token tables and lists, chart cell text, quoted “tokens”).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

I18N = Path(__file__).resolve().parents[2] / "static" / "i18n"


def catalogue(lang: str) -> dict[str, str]:
    """static/i18n/{lang}.js: a comment, then `export default {json};` (whose own lines may be
    `// ...` comments that head a block of keys)."""
    text = (I18N / f"{lang}.js").read_text(encoding="utf-8")
    body = text[text.index("export default ") + len("export default "):].rstrip().removesuffix(";")
    body = "\n".join(line for line in body.splitlines() if not line.lstrip().startswith("//"))
    return dict(json.loads(body))


def error_key(code: str) -> str | None:
    """The catalogue key static/js/i18n.js's errorText reads for a server error's ``code``: ``err.<code>``,
    where both catalogues have it (None: the page shows the server's English words after a translated lead)."""
    key = f"err.{code}"
    return key if all(key in catalogue(lang) for lang in ("en", "zh")) else None


PLACEHOLDER = re.compile(r"\{(\w+)\}")


def placeholders(key: str) -> set[str]:
    """The names a catalogue text fills (``{limit}``), in either language."""
    return {name for lang in ("en", "zh") for name in PLACEHOLDER.findall(catalogue(lang)[key])}


WORD = re.compile(r"[A-Za-z][A-Za-z_]*")
MATH = re.compile(r"[A-Za-z]_[A-Za-z]?")  # h_t, x_t, h_{t-1}: symbols with a subscript
# exact spellings (case matters: "LM Head" is the seed's term, a bare "head" is not)
ALLOWED = {
    "token", "tokens", "Token", "Tokens", "Tokenizer", "ID", "IDs", "Embedding", "Attention", "Self", "FFN",
    "Causal", "Mask", "d_model", "d_head", "hidden", "representation", "residual", "stream", "Residual", "Stream", "Hidden", "Representation", "LM", "Head",
    "logit", "logits", "softmax", "Transformer", "Block", "Blocks", "Encoder", "Decoder", "only", "RNN", "RoPE", "GPT", "Llama",
    "QK", "KV", "Q", "K", "V", "W_O", "v", "x", "h", "h_t", "x_t", "t", "n", "k", "i", "p", "cos", "tanh", "E", "X",
    "attnscope", "PNG", "SVG", "JSON", "OpenAPI", "ALiBi", "KL", "ln", "safetensors", "HTML", "MB", "KB",
    "Ctrl", "Enter",  # key names on the keyboard, as printed on its keys
}

# Every string a reader can see or hover, and the token text among it, from the live page.
COLLECT = r"""() => {
  const texts = [], tokens = [];
  const add = (list, s) => { if (s !== undefined && s !== null && String(s).trim()) list.push(String(s)); };
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const p = n.parentElement;
    if (!p || p.closest("script, style, textarea, .js-plotly-plot") || !p.checkVisibility()) continue;
    add(p.closest(".mono, option, .stream, .t, .example") ? tokens : texts, n.textContent);
  }
  for (const e of document.querySelectorAll("[title], [aria-label], [placeholder], [data-title]")) {
    if (e.closest(".stream, .token")) continue;
    for (const a of ["title", "aria-label", "placeholder", "data-title"]) add(texts, e.getAttribute(a));
  }
  for (const e of document.querySelectorAll("input, textarea")) add(tokens, e.value);
  for (const gd of document.querySelectorAll(".js-plotly-plot")) {
    if (!gd.checkVisibility()) continue;
    for (const tx of gd.querySelectorAll("svg text")) add(texts, tx.textContent);
    for (const tr of gd.data || []) {
      add(texts, tr.hovertemplate);
      if (tr.colorbar && tr.colorbar.title) add(texts, tr.colorbar.title.text);
      if (Array.isArray(tr.text)) add(tokens, tr.text.flat().join(" "));
      if (Array.isArray(tr.hovertext)) add(tokens, tr.hovertext.flat().join(" "));
      if (gd.dataset.tokenX && Array.isArray(tr.x)) add(tokens, tr.x.join(" "));
      if (gd.dataset.tokenY && Array.isArray(tr.y)) add(tokens, tr.y.join(" "));
    }
    const L = gd.layout || {};
    for (const [k, v] of Object.entries(L)) {
      if (!v || typeof v !== "object") continue;
      if (v.title) add(texts, typeof v.title === "string" ? v.title : v.title.text);
      if (/^[xy]axis/.test(k) && Array.isArray(v.ticktext)) add(tokens, v.ticktext.join(" "));
    }
    if (gd.dataset.tokenLegend) for (const tr of gd.data || []) add(tokens, tr.name);
    else for (const tr of gd.data || []) add(texts, tr.name);
  }
  // headings and tabs: in Chinese mode each must say something in Chinese (a bare English term is a half-translated UI)
  const labels = [];
  for (const e of document.querySelectorAll("h1, h2, h3, h4, [role=tab]")) {
    if (e.checkVisibility()) add(labels, e.textContent);
  }
  const quoted = [];
  for (const s of texts) for (const m of s.matchAll(/[“"]([^”"]*)[”"]/g)) quoted.push(m[1]);
  return { texts, tokens: [...tokens, ...quoted], labels };
}"""


def visible_strings(page: object) -> dict[str, list[str]]:
    return page.evaluate(COLLECT)


def ui_words() -> set[str]:
    words: set[str] = set()
    for key, text in catalogue("en").items():
        if key.startswith("err."):
            continue  # shown only when something fails
        words.update(w.lower() for w in WORD.findall(re.sub(r"\{\w+\}|%\{[^}]*\}", " ", text)))
    return words


def model_words(base_url: str) -> set[str]:
    """The words of the served models' own identifiers (name, architecture, family, dtype,
    device): data the page shows, not words of the interface."""
    import httpx

    words: set[str] = set()
    for m in httpx.get(f"{base_url}/api/models", timeout=30).json()["models"]:
        for field in ("name", "architecture", "family", "dtype", "device"):
            words.update(w.lower() for w in WORD.findall(str(m[field])))
    return words


HAN = re.compile("[\u3400-\u9fff]")
# a space after a full-width stop or comma: sentences joined the English way ("0.76。 它们")
STRAY_SPACE = re.compile(r"[。！？；，：]\s+\S")


def half_translated(found: dict[str, list[str]]) -> dict[str, list[str]]:
    """Chinese-mode defects the word check cannot see: a heading or tab with no Chinese in it
    (only a seed term like "Attention" next to Chinese headings), and a space left after 。."""
    bad: dict[str, list[str]] = {}
    for label in found.get("labels", []):
        if not HAN.search(label) and label.strip() != "attnscope":
            bad.setdefault("heading or tab without Chinese", []).append(label[:80])
    for text in found["texts"]:
        if STRAY_SPACE.search(text):
            bad.setdefault("space after a Chinese stop", []).append(text[:80])
    return bad


def english_ui_words(found: dict[str, list[str]], base_url: str | None = None, *_unused: object,
                     strict: bool = False) -> dict[str, list[str]]:
    """{word: [where it was seen]} for every English UI word outside token text.

    By default a word counts when the English catalogue uses it; ``strict`` counts every Latin
    word (so that a string never put in the catalogue is caught too). Either way the seed's
    terms, symbols, token text and the models' own identifiers are allowed."""
    token_words = {w.lower() for s in found["tokens"] for w in WORD.findall(s.replace("␣", " "))}
    data = model_words(base_url) if base_url else set()
    vocabulary = ui_words()
    bad: dict[str, list[str]] = {}
    own_name = catalogue("zh")["lang.switch"]  # the switch names the other language in its own words
    for text in found["texts"]:
        if text.strip() == own_name:
            continue
        cleaned = re.sub(r"‹[0-9a-f ]+›|%\{[^}]*\}|<[^>]*>", " ", text.replace("␣", " "))  # bytes, plotly fields and tags
        for w in WORD.findall(cleaned):
            if len(w) == 1 or MATH.fullmatch(w) or w in ALLOWED or w.lower() in token_words or w.lower() in data:
                continue
            if not strict and w.lower() not in vocabulary:
                continue
            bad.setdefault(w, []).append(text[:80])
    bad.update(half_translated(found))
    return bad
