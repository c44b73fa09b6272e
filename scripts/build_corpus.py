"""Build the English training corpus for the bundled decoder from Debian packages.

Why these sources: they are English prose that Debian ships under licences that
allow redistribution and derived works (see model/bundled/attnscope-tiny/README.md):

* ``fortunes`` / ``fortunes-min`` — quotations and jokes (BSD-style / public domain),
* ``wordnet-base`` — dictionary glosses and example sentences (WordNet 3.0 licence),
* ``python3.11-doc`` — the Python documentation sources (PSF licence).

The packages are fetched with ``apt-get download`` and unpacked with ``dpkg -x``
into a scratch folder, so nothing is installed on the system.

Usage::

    python scripts/build_corpus.py --out data/corpus
"""

from __future__ import annotations

import argparse
import logging
import random
import re
import subprocess
import tempfile
from pathlib import Path

log = logging.getLogger("build_corpus")

PACKAGES = ("fortunes", "fortunes-min", "wordnet-base", "python3.11-doc")
# fortune files that are pictures or rot13, not prose
SKIP_FORTUNES = {"art", "ascii-art"}


def fetch_packages(workdir: Path) -> Path:
    """Download and unpack PACKAGES into workdir/root; returns the root."""
    root = workdir / "root"
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(["apt-get", "download", *PACKAGES], cwd=workdir, check=True)
    for deb in sorted(workdir.glob("*.deb")):
        subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True)
    return root


def fortunes(root: Path) -> list[str]:
    docs: list[str] = []
    folder = root / "usr/share/games/fortunes"
    for path in sorted(folder.iterdir()):
        if path.suffix or path.name in SKIP_FORTUNES or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for chunk in text.split("\n%\n"):
            chunk = re.sub(r"[ \t]+", " ", chunk).strip()
            if len(chunk) > 20:
                docs.append(chunk)
    return docs


def wordnet(root: Path) -> list[str]:
    """One short document per synset: 'word, synonym: gloss. "example".'"""
    docs: list[str] = []
    folder = root / "usr/share/wordnet"
    for pos in ("noun", "verb", "adj", "adv"):
        for line in (folder / f"data.{pos}").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith(" ") or "|" not in line:
                continue
            head, gloss = line.split("|", 1)
            fields = head.split()
            n_words = int(fields[3], 16)
            words = [fields[4 + 2 * i].replace("_", " ") for i in range(n_words)]
            words = [re.sub(r"\(.*?\)$", "", w) for w in words]
            gloss = gloss.strip()
            parts = [p.strip() for p in gloss.split(";") if p.strip()]
            definition = parts[0] if parts else ""
            examples = [p.strip('"') for p in parts[1:] if p.startswith('"')]
            sentence = f"{', '.join(words)}: {definition}."
            if examples:
                sentence += " For example: " + " ".join(e[0].upper() + e[1:] + "." for e in examples if e)
            docs.append(sentence)
    return docs


_ROLE = re.compile(r":[a-z:]+:`~?([^`<]*?)(?:\s*<[^>]*>)?`")
_LINK = re.compile(r"`([^`<]+?)\s*(?:<[^>]*>)?`_*")


def python_docs(root: Path) -> list[str]:
    """Prose paragraphs of the Python docs: directives, code blocks and tables dropped."""
    docs: list[str] = []
    folder = root / "usr/share/doc/python3.11/html/_sources"
    for path in sorted(folder.rglob("*.txt")):
        if "whatsnew" in path.parts or "c-api" in path.parts:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for para in re.split(r"\n\s*\n", text):
            lines = para.splitlines()
            if not lines or lines[0].startswith((" ", "\t", "..", "+", "|", "=", "-", "*", ">>>", ":")):
                continue
            prose = " ".join(line.strip() for line in lines)
            prose = _ROLE.sub(r"\1", prose)
            prose = _LINK.sub(r"\1", prose).replace("``", "").replace("**", "").replace("::", ":")
            if len(prose) > 60 and prose.count(" ") > 8:
                docs.append(prose)
    return docs


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("data/corpus"))
    parser.add_argument("--debs", type=Path, default=None, help="reuse an unpacked root instead of downloading")
    parser.add_argument("--heldout", type=float, default=0.01, help="share of documents held out")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        root = args.debs or fetch_packages(Path(tmp))
        sources = {"fortunes": fortunes(root), "wordnet": wordnet(root), "python-docs": python_docs(root)}
    docs = [d for group in sources.values() for d in group]
    random.Random(args.seed).shuffle(docs)
    n_held = max(1, int(len(docs) * args.heldout))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "heldout.txt").write_text("\n\n".join(docs[:n_held]) + "\n", encoding="utf-8")
    (args.out / "train.txt").write_text("\n\n".join(docs[n_held:]) + "\n", encoding="utf-8")
    for name, group in sources.items():
        log.info("%-12s %7d documents %9d characters", name, len(group), sum(map(len, group)))
    log.info("wrote %s (%d train / %d held-out documents)", args.out, len(docs) - n_held, n_held)


if __name__ == "__main__":
    main()
