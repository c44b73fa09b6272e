"""The two message catalogues (static/i18n/en.js, zh.js) hold the same keys with the same
placeholders, and every key the pages use exists."""

from __future__ import annotations

import re
from pathlib import Path

from tests.i18n_check import ALLOWED, MATH, WORD, catalogue

ROOT = Path(__file__).resolve().parents[1]
CATALOGUES = {lang: catalogue(lang) for lang in ("en", "zh")}
PLACEHOLDER = re.compile(r"\{(\w+)\}")


def test_same_keys_and_placeholders() -> None:
    en, zh = CATALOGUES["en"], CATALOGUES["zh"]
    assert sorted(en) == sorted(zh)
    for key in en:
        assert en[key].strip() and zh[key].strip(), key
        assert set(PLACEHOLDER.findall(en[key])) == set(PLACEHOLDER.findall(zh[key])), key
        # plotly field references (%{y:.3f}) and markup survive translation
        assert sorted(re.findall(r"%\{[^}]*\}|<[^>]*>", en[key])) == sorted(re.findall(r"%\{[^}]*\}|<[^>]*>", zh[key])), key


def test_chinese_keeps_only_the_seeds_english_terms() -> None:
    """Latin words in the Chinese catalogue are the technical terms the seed note writes in
    English, symbols, names and quoted example text — nothing else."""
    examples = {"x.placeholder": "I love artificial intelligence", "l6.p": "dog bites man the",
                "lang.switch": "English"}  # a language switch names the other language in its own words
    for key, text in CATALOGUES["zh"].items():
        plain = re.sub(r"\{\w+\}|%\{[^}]*\}|<[^>]*>", " ", text)
        allowed = set(examples.get(key, "").split())
        stray = [w for w in WORD.findall(plain) if not (len(w) == 1 or MATH.fullmatch(w) or w in ALLOWED or w in allowed)]
        assert stray == [], f"{key}: {text!r}"


def used_keys() -> set[str]:
    keys: set[str] = set()
    for path in [*(ROOT / "static" / "js").rglob("*.js"), *(ROOT / "templates").glob("*.html")]:
        text = path.read_text(encoding="utf-8")
        keys.update(re.findall(r"""\bt\(\s*["']([\w.]+)["']""", text))
        keys.update(re.findall(r"""\btr\(\s*["']([\w.]+)["']""", text))
        keys.update(re.findall(r"""data-i18n(?:-[a-z]+)?="([\w.]+)\"""", text))
    return keys


def test_every_key_used_exists() -> None:
    missing = sorted(k for k in used_keys() if k not in CATALOGUES["en"])
    assert missing == []
