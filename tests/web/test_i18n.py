"""The two message catalogues (static/i18n/en.js, zh.js) hold the same keys with the same
placeholders, and every key the pages use exists."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.i18n_check import ALLOWED, MATH, WORD, catalogue

ROOT = Path(__file__).resolve().parents[2]
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
    examples = {"x.placeholder": "I love artificial intelligence", "positions.p": "dog bites man the",
                "lang.switch": "English", "err.patch_one": "Peter",  # the Patch tool's example answer
                "err.patch_same": "answer wrong", "err.patch_same_token": "answer wrong",
                "err.patch_flops": "TFLOP",
                # what a person types or configures, as written: device names, a command, HTTP and encodings
                "err.device_invalid": "auto cpu cuda mps", "err.package_missing": "pip install",
                "err.hub_unreachable": "Hugging Face Hub", "err.http_error": "HTTP",
                "err.unsupported_media_type": "UTF", "err.body_not_utf8": "UTF",
                "x.model.loading": "GGUF",  # the model file format, by its name
                }  # a language switch names the other language in its own words
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


def test_half_translated_chinese_is_caught() -> None:
    """The check behind the Chinese-mode browser tests flags a heading or tab with no Chinese
    and a space left after a full stop, and passes their fixed forms."""
    from tests.support.i18n_check import half_translated

    found = {"texts": ["权重 0.76。 它们", "这里。它们"], "tokens": [],
             "labels": ["Attention", "residual stream", "9 · Residual stream", "注意力", "9 · 残差流（residual stream）"]}
    bad = half_translated(found)
    assert bad["heading or tab without Chinese"] == ["Attention", "residual stream", "9 · Residual stream"]
    assert bad["space after a Chinese stop"] == ["权重 0.76。 它们"]


def test_chinese_headings_and_tabs_say_something_in_chinese() -> None:
    """Lesson headings, explorer panel headings and tool tabs: each holds Chinese, not only a term."""
    cjk = re.compile("[\u3400-\u9fff]")
    zh = CATALOGUES["zh"]
    keys = [k for k in zh if re.fullmatch(r"(?:context|parallel|ids|embedding|shapes|positions|encoders|pipeline|residual)\.h|x\.tool\.(?!intro|encoder)\w+|x\.(attention|tokens|heads|focus|next)", k)]
    assert {"residual.h", "x.attention", "x.tool.residual"} <= set(keys)
    assert [k for k in keys if not cjk.search(zh[k])] == []


def test_singular_forms_pair_with_their_plural() -> None:
    """A "key.one" form (read by t() when vars.n is 1) sits beside its plural, with the same
    placeholders, and says something else in English: "1 head ablated", not "1 heads"."""
    en = CATALOGUES["en"]
    ones = [k for k in en if k.endswith(".one")]
    assert {"abl.note.one", "patch.summary.one", "x.heat.tokens.one"} <= set(ones)
    for key in ones:
        plural = key.removesuffix(".one")
        assert plural in en, key
        assert "n" in PLACEHOLDER.findall(en[plural]), key
        assert set(PLACEHOLDER.findall(en[key])) == set(PLACEHOLDER.findall(en[plural])), key
        assert en[key] != en[plural] and "(s)" not in en[plural], key
    i18n = (ROOT / "static" / "js" / "i18n.js").read_text(encoding="utf-8")
    assert "vars.n === 1" in i18n and "`${key}.one`" in i18n


def test_no_key_is_written_twice() -> None:
    """A key written twice in a catalogue silently reads its last text (in JavaScript and in catalogue())."""
    for lang in ("en", "zh"):
        keys = re.findall(r'^\s*"([\w.]+)":', (ROOT / "static" / "i18n" / f"{lang}.js").read_text(encoding="utf-8"), re.M)
        assert sorted(k for k in set(keys) if keys.count(k) > 1) == [], lang


def test_lessons_are_named_by_topic_in_one_order() -> None:
    """Learn's lessons go by their topic, not a number: the page's sections (templates/learn.html), the
    lesson list (static/js/learn/main.js), their modules and their catalogue keys agree, in one order."""
    template = (ROOT / "templates" / "learn.html").read_text(encoding="utf-8")
    main = (ROOT / "static" / "js" / "learn" / "main.js").read_text(encoding="utf-8")
    listed = re.search(r'\{% for topic in \[([^\]]*)\] %\}', template)
    assert listed is not None
    sections = re.findall(r'"(\w+)"', listed.group(1))
    lessons = re.findall(r'\{ topic: "(\w+)", module: (\w+) \}', main)
    assert [topic for topic, _module in lessons] == sections and len(sections) == 9
    for topic, module in lessons:
        assert module == topic and (ROOT / "static" / "js" / "learn" / f"{topic}.js").is_file(), topic
        assert f'import * as {topic} from "./{topic}.js";' in main, topic
        for lang in ("en", "zh"):
            assert {f"{topic}.h", f"{topic}.p"} <= set(CATALOGUES[lang]), (lang, topic)
    numbered = [k for k in CATALOGUES["en"] if re.match(r"l[1-9]\.", k)]
    assert numbered == [], numbered  # no lesson key goes by its number any more


def test_the_explorers_types_name_the_apis_fields() -> None:
    """static/js/state.js's JSDoc types of the run and its parts have the fields of the Python
    declarations the routes answer with, so a field added there is missed here by no one."""
    import dataclasses

    from attnscope.app.runjson import RunBody
    from attnscope.app.schemas import TruncatedOut
    from attnscope.model.load.tokens import Token
    from attnscope.model.results import ActualNext, PositionPrediction, TokenProb
    from attnscope.model.scores.analysis import HeadScore

    source = (ROOT / "static" / "js" / "state.js").read_text(encoding="utf-8")
    types = {name: body for body, name in re.findall(r"@typedef \{\{(.*?)\}\} (\w+)", source, re.S)}
    for cls in (RunBody, Token, TokenProb, ActualNext, PositionPrediction, HeadScore):
        declared = {f.name for f in dataclasses.fields(cls)}
        documented = set(re.findall(r"(\w+): ", re.sub(r"\{[^{}]*\}", "", types[cls.__name__].replace("\n *", " "))))
        assert documented == declared, (cls.__name__, documented ^ declared)
    assert set(re.findall(r"(\w+): ", types["Truncated"])) == set(TruncatedOut.model_fields)
