"""Build the training corpus of the bundled decoder (English with some Chinese) from Debian packages.

Every source is a Debian package whose copyright file allows redistribution and derived
works; the licence of each is in SOURCES below and in the model card. The packages are
fetched with ``apt-get download`` and unpacked with ``dpkg -x`` into a scratch folder, so
nothing is installed on the system (the KJV text is read with the ``bible`` program of
the ``bible-kjv`` package, run from that scratch folder).

Only prose is kept: code blocks, tables, markup and program listings are dropped. Each
source is capped at a number of characters (``CAPS``) so that no one style dominates,
and the documents are shuffled with a fixed seed before the held-out split, so the same
packages give the same corpus.

Usage::

    python scripts/build_corpus.py --out data/corpus            # downloads the packages
    python scripts/build_corpus.py --out data/corpus --debs /tmp/root   # an unpacked root
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import random
import re
import subprocess
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable
from html.parser import HTMLParser
from pathlib import Path

log = logging.getLogger("build_corpus")

# source name -> (Debian packages, licence as the package's copyright file states it)
SOURCES: dict[str, tuple[tuple[str, ...], str]] = {
    "kjv": (("bible-kjv-text", "bible-kjv"), "King James Version text: 'Users may copy, modify or distribute this file at will' (Chip Chapin, 1989); the text itself is in the public domain"),
    "fortunes": (("fortunes", "fortunes-min"), "BSD-style (fortune-mod) / public domain quotations"),
    "wordnet": (("wordnet-base",), "WordNet 3.0 licence (Princeton; use, copy, modify and distribute for any purpose)"),
    "jargon": (("jargon-text",), "public domain (the Jargon File 4.4.7, Eric S. Raymond)"),
    "debian-handbook": (("debian-handbook",), "GPL-2.0+ or CC-BY-SA-3.0"),
    "debian-reference": (("debian-reference-en", "debian-reference-zh-cn"), "GPL-2+"),
    "gnome-help": (("gnome-user-docs",), "CC-BY-SA-3.0"),
    "perl-doc": (("perl-doc",), "GPL-1+ or Artistic"),
    "postgresql-doc": (("postgresql-doc-15",), "PostgreSQL licence (BSD-like)"),
    "linux-doc": (("linux-doc-6.1",), "GPL-2"),
    "fortunes-zh": (("fortunes-zh",), "GPL-3.0+"),
    "manpages-zh": (("manpages-zh",), "GFDL-1.2+ / GPL-2+ / public domain (per page, see its copyright file)"),
}
PACKAGES = tuple(p for packages, _ in SOURCES.values() for p in packages)

# characters kept per source (after cleaning); English sources first, then Chinese
CAPS = {
    "kjv": 4_500_000, "fortunes": 2_500_000, "wordnet": 3_000_000, "jargon": 1_200_000,
    "debian-handbook": 2_000_000, "debian-reference": 1_200_000, "gnome-help": 1_500_000,
    "perl-doc": 2_000_000, "postgresql-doc": 2_000_000, "linux-doc": 2_500_000,
    # Chinese: characters, not bytes (3 bytes each in UTF-8)
    "fortunes-zh": 350_000, "debian-reference-zh": 250_000, "gnome-help-zh": 250_000,
    "linux-doc-zh": 200_000, "manpages-zh": 200_000,
}
SKIP_FORTUNES = {"art", "ascii-art", "chinese", "tang300", "song100"}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_CJK = re.compile(r"[\u4e00-\u9fff]")


def fetch_packages(workdir: Path) -> Path:
    """Download and unpack PACKAGES into workdir/root; returns the root."""
    root = workdir / "root"
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(["apt-get", "download", *PACKAGES], cwd=workdir, check=True)
    for deb in sorted(workdir.glob("*.deb")):
        subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True)
    return root


def read(path: Path) -> str:
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    return data.decode("utf-8", errors="replace")


def squash(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def is_chinese(text: str, share: float = 0.3) -> bool:
    return len(_CJK.findall(text)) >= share * max(1, len(text.replace(" ", "")))


def group(paragraphs: Iterable[str], size: int = 2500) -> list[str]:
    """Consecutive paragraphs joined (one per line) into documents of about ``size`` characters."""
    docs: list[str] = []
    current: list[str] = []
    for para in paragraphs:
        current.append(para)
        if sum(map(len, current)) >= size:
            docs.append("\n".join(current))
            current = []
    if current:
        docs.append("\n".join(current))
    return docs


# --- English -------------------------------------------------------------------------------


def kjv(root: Path) -> list[str]:
    """One document per chapter: its title, then one verse per line (verse numbers dropped)."""
    out = subprocess.run([str(root / "usr/bin/bible"), "-p", str(root / "usr/lib"), "gen1:1-rev22:21"],
                         capture_output=True, check=True).stdout.decode("utf-8", errors="replace")
    docs: list[str] = []
    for chapter in re.split(r"\n(?=\S[^\n]* \d+\n\n)", out.strip()):
        title, _, body = chapter.strip().partition("\n")
        verses = [squash(v) for v in re.split(r"\n\s+\d+ ", "\n" + body.strip()) if v.strip()]
        verses = [re.sub(r"^\d+ ", "", v) for v in verses]
        if verses:
            docs.append(title.strip() + "\n" + "\n".join(verses))
    return docs


def fortune_file(path: Path) -> list[str]:
    docs = []
    for chunk in _ANSI.sub("", read(path)).split("\n%\n"):
        chunk = re.sub(r"[ \t]+", " ", chunk).strip()
        if len(chunk) > 20:
            docs.append(chunk)
    return docs


def fortunes(root: Path) -> list[str]:
    folder = root / "usr/share/games/fortunes"
    docs: list[str] = []
    for path in sorted(folder.iterdir()):
        if path.suffix or path.name in SKIP_FORTUNES or not path.is_file():
            continue
        docs += fortune_file(path)
    return docs


def wordnet(root: Path) -> list[str]:
    """One short document per synset: 'word, synonym: gloss. For example: ...'"""
    docs: list[str] = []
    folder = root / "usr/share/wordnet"
    for pos in ("noun", "verb", "adj", "adv"):
        for line in (folder / f"data.{pos}").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith(" ") or "|" not in line:
                continue
            head, gloss = line.split("|", 1)
            fields = head.split()
            n_words = int(fields[3], 16)
            words = [re.sub(r"\(.*?\)$", "", fields[4 + 2 * i].replace("_", " ")) for i in range(n_words)]
            parts = [p.strip() for p in gloss.strip().split(";") if p.strip()]
            definition = parts[0] if parts else ""
            examples = [p.strip('"') for p in parts[1:] if p.startswith('"')]
            sentence = f"{', '.join(words)}: {definition}."
            if examples:
                sentence += " For example: " + " ".join(e[0].upper() + e[1:] + "." for e in examples if e)
            docs.append(sentence)
    return docs


def jargon(root: Path) -> list[str]:
    folder = root / "usr/share/jargon-text" if (root / "usr/share/jargon-text").exists() else root / "usr/share/doc/jargon-text"
    paragraphs: list[str] = []
    for path in sorted(folder.rglob("*")):
        if not path.is_file() or "copyright" in path.name or "changelog" in path.name:
            continue
        for para in re.split(r"\n\s*\n", read(path)):
            if para.startswith(("   ", "\t")) and len(para) < 200:
                continue
            prose = squash(para)
            if len(prose) > 60 and prose.count(" ") > 8:
                paragraphs.append(prose)
    return group(paragraphs)


class _Prose(HTMLParser):
    """Text of block elements (p, li, dd, dt, headings), skipping pre, code listings, scripts and tables."""

    BLOCKS = frozenset({"p", "li", "dd", "dt", "h1", "h2", "h3", "h4", "title", "desc"})
    SKIP = frozenset({"pre", "script", "style", "table", "code", "screen", "programlisting", "synopsis", "media"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.paragraphs: list[str] = []
        self.buffer: list[str] = []
        self.skip = 0
        self.depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.SKIP:
            self.skip += 1
        elif tag in self.BLOCKS or (tag == "div" and ("class", "para") in attrs):  # DocBook's paragraphs
            self.flush()
            self.depth += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in self.SKIP:
            self.skip = max(0, self.skip - 1)
        elif tag in self.BLOCKS or (tag == "div" and self.depth):
            self.flush()
            self.depth = max(0, self.depth - 1)

    def handle_data(self, data: str) -> None:
        if not self.skip and self.depth:
            self.buffer.append(data)

    def flush(self) -> None:
        text = squash("".join(self.buffer))
        self.buffer = []
        if text:
            self.paragraphs.append(text)


def markup_prose(paths: Iterable[Path], min_chars: int = 40, chinese: bool = False) -> list[str]:
    """Documents of prose paragraphs from HTML or Mallard (.page) files, one group per file."""
    docs: list[str] = []
    for path in paths:
        parser = _Prose()
        parser.feed(read(path))
        parser.flush()
        keep = [p for p in parser.paragraphs if len(p) >= (min_chars // 3 if chinese else min_chars)
                and is_chinese(p) == chinese]
        docs += group(keep)
    return docs


def debian_handbook(root: Path) -> list[str]:
    return markup_prose(sorted((root / "usr/share/doc/debian-handbook/html/en-US").glob("*.html")))


def postgresql_doc(root: Path) -> list[str]:
    return markup_prose(sorted((root / "usr/share/doc/postgresql-doc-15/html").glob("*.html")))


def gnome_help(root: Path, lang: str = "C") -> list[str]:
    paths = sorted((root / "usr/share/help" / lang).rglob("*.page"))
    return markup_prose(paths, chinese=lang != "C")


def debian_reference(root: Path, lang: str = "en") -> list[str]:
    paths = sorted((root / "usr/share/debian-reference").glob(f"*.{lang}.html"))
    return markup_prose(paths, chinese=lang != "en")


_RST_ROLE = re.compile(r":[a-z:]+:`~?([^`<]*?)(?:\s*<[^>]*>)?`")
_RST_LINK = re.compile(r"`([^`<]+?)\s*(?:<[^>]*>)?`_*")


def rst_prose(paths: Iterable[Path], chinese: bool = False) -> list[str]:
    """Prose paragraphs of reStructuredText: directives, literal blocks, tables and lists of symbols dropped."""
    docs: list[str] = []
    for path in paths:
        paragraphs = []
        for para in re.split(r"\n\s*\n", read(path)):
            lines = para.splitlines()
            if not lines or lines[0].startswith((" ", "\t", "..", "+", "|", "=", "-", "*", ">>>", ":", "#", "~")):
                continue
            prose = squash(" ".join(lines) if not chinese else "".join(line.strip() for line in lines))
            prose = _RST_ROLE.sub(r"\1", prose)
            prose = _RST_LINK.sub(r"\1", prose).replace("``", "").replace("**", "").replace("::", ":")
            if chinese:
                if len(prose) > 20 and is_chinese(prose):
                    paragraphs.append(prose)
            elif len(prose) > 60 and prose.count(" ") > 8 and not is_chinese(prose, 0.01):
                paragraphs.append(prose)
        docs += group(paragraphs)
    return docs


def linux_doc(root: Path, chinese: bool = False) -> list[str]:
    folder = root / "usr/share/doc/linux-doc-6.1/Documentation"
    if chinese:
        paths = sorted((folder / "translations/zh_CN").rglob("*.rst*"))
    else:
        keep = ("admin-guide", "process", "filesystems", "scheduler", "core-api", "networking", "security", "doc-guide")
        paths = sorted(p for part in keep for p in (folder / part).rglob("*.rst*"))
    return rst_prose(paths, chinese=chinese)


_POD_CODE = re.compile(r"[A-Z]<+\s*(.*?)\s*>+")


def perl_doc(root: Path) -> list[str]:
    """Prose paragraphs of the Perl manual pages (POD): commands and verbatim (indented) blocks dropped."""
    docs: list[str] = []
    for path in sorted((root / "usr/share/perl").rglob("pod/*.pod")):
        paragraphs = []
        for para in re.split(r"\n\s*\n", read(path)):
            if not para.strip() or para.startswith((" ", "\t", "=")):
                continue
            prose = squash(_POD_CODE.sub(r"\1", para))
            if len(prose) > 60 and prose.count(" ") > 8:
                paragraphs.append(prose)
        docs += group(paragraphs)
    return docs


# --- Chinese -------------------------------------------------------------------------------


def fortunes_zh(root: Path) -> list[str]:
    folder = root / "usr/share/games/fortunes"
    return [d for name in ("chinese", "tang300", "song100") for d in fortune_file(folder / name) if is_chinese(d, 0.2)]


def manpages_zh(root: Path) -> list[str]:
    """Running text of the Simplified Chinese manual pages: roff requests and escapes dropped."""
    docs: list[str] = []
    for path in sorted((root / "usr/share/man/zh_CN").rglob("*.gz")):
        paragraphs, current = [], []
        for line in read(path).splitlines():
            if line.startswith((".", "'")):
                if line[:3] in (".PP", ".SH", ".TP", ".IP", ".LP", ".P", ".SS") and current:
                    paragraphs.append("".join(current))
                    current = []
                continue
            current.append(re.sub(r"\\f[BIRP]|\\\(..|\\[-&e]|\\", "", line).strip())
        if current:
            paragraphs.append("".join(current))
        docs += group(p for p in paragraphs if len(p) > 20 and is_chinese(p))
    return docs


def everyday_words(root: Path, corpus_text: str, count: int = 5000) -> list[str]:
    """The ``count`` most frequent WordNet lemmas of SemCor (sense-tagged Brown corpus counts, cntlist.rev),
    each followed by its regular inflections that occur in the corpus: a list of everyday words,
    independent of the corpus's own bias towards scripture and software manuals."""
    totals: Counter[str] = Counter()
    for line in (root / "usr/share/wordnet/cntlist.rev").read_text(encoding="utf-8").splitlines():
        key, _, tagged = line.split()
        lemma = key.split("%")[0]
        if lemma.isalpha() and lemma.isascii():
            totals[lemma] += int(tagged)
    seen = Counter(w.lower() for w in re.findall(r"[A-Za-z]+", corpus_text))
    words: list[str] = []
    for lemma, _ in totals.most_common(count):
        stem = lemma[:-1] if lemma.endswith("e") else lemma
        forms = [lemma, lemma + "s", lemma + "es", lemma + "d", lemma + "ed", stem + "ing", lemma[:-1] + "ies"]
        words += [f for f in forms if f == lemma or seen[f] >= 5]
    return list(dict.fromkeys(words))


EXTRACTORS: dict[str, Callable[[Path], list[str]]] = {
    "kjv": kjv, "fortunes": fortunes, "wordnet": wordnet, "jargon": jargon,
    "debian-handbook": debian_handbook, "debian-reference": debian_reference, "gnome-help": gnome_help,
    "perl-doc": perl_doc, "postgresql-doc": postgresql_doc, "linux-doc": linux_doc,
    "fortunes-zh": fortunes_zh, "debian-reference-zh": lambda r: debian_reference(r, "zh-cn"),
    "gnome-help-zh": lambda r: gnome_help(r, "zh_CN"), "linux-doc-zh": lambda r: linux_doc(r, chinese=True),
    "manpages-zh": manpages_zh,
}


def capped(docs: list[str], cap: int, seed: int) -> list[str]:
    """A seeded random subset of documents, in order, holding at most ``cap`` characters."""
    order = list(range(len(docs)))
    random.Random(seed).shuffle(order)
    keep, total = [], 0
    for i in order:
        if total + len(docs[i]) > cap:
            continue
        keep.append(i)
        total += len(docs[i])
    return [docs[i] for i in sorted(keep)]


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("data/corpus"))
    parser.add_argument("--debs", type=Path, default=None, help="reuse an unpacked root instead of downloading")
    parser.add_argument("--heldout", type=float, default=0.01, help="share of documents held out")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        root = args.debs or fetch_packages(Path(tmp))
        sources = {name: capped(extract(root), CAPS[name], args.seed) for name, extract in EXTRACTORS.items()}
        everyday = everyday_words(root, "\n".join(d for group_ in sources.values() for d in group_))
    docs = [(name, d.replace("\n\n", "\n")) for name, group_ in sources.items() for d in group_]
    random.Random(args.seed).shuffle(docs)
    n_held = max(1, int(len(docs) * args.heldout))
    args.out.mkdir(parents=True, exist_ok=True)
    held, train = docs[:n_held], docs[n_held:]
    (args.out / "heldout.txt").write_text("\n\n".join(d for _, d in held) + "\n", encoding="utf-8")
    (args.out / "train.txt").write_text("\n\n".join(d for _, d in train) + "\n", encoding="utf-8")
    (args.out / "everyday_words.txt").write_text("\n".join(everyday) + "\n", encoding="utf-8")
    stats = {}
    for name, group_ in sources.items():
        chars = sum(map(len, group_))
        stats[name] = {"documents": len(group_), "characters": chars,
                       "utf8_bytes": sum(len(d.encode("utf-8")) for d in group_)}
        log.info("%-20s %7d documents %9d characters", name, len(group_), chars)
    licences = {name: {"packages": list(SOURCES[base][0]), "licence": SOURCES[base][1]}
                for name in sources for base in [name if name in SOURCES else name.removesuffix("-zh")]}
    (args.out / "sources.json").write_text(json.dumps({"sources": stats, "licences": licences,
                                                       "heldout_documents": n_held, "seed": args.seed}, indent=1))
    log.info("wrote %s (%d train / %d held-out documents)", args.out, len(train), len(held))


if __name__ == "__main__":
    main()
