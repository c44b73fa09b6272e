"""A run's standalone HTML file (``export?format=html``, ``run.save_html``): one document that asks nothing
of a server or a CDN, under 2 MB with plotly.js for a 64-token run of the bundled model, its size said
before the download (``dry_run=1``), and above the budget every head's thumbnail plus the exact cells of
the heads asked for. The page itself, opened from file:// with the network blocked, is tested in
tests/web/test_standalone_browser.py."""

from __future__ import annotations

import asyncio
import gzip
import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import pytest
from fastapi.testclient import TestClient

import attnscope
from attnscope.app import standalone
from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.model.load.models import BUNDLED_DIR, LoadedModel, load_model
from tests.support.tiny import make_engine

TWO_MB = 2_000_000
SENTENCE = "The cat sat on the mat and looked at the dog. "


def decoded(html: bytes) -> tuple[dict[str, Any], bytes]:
    """The manifest and the blob area of a file's payload (the inverse of app/standalone.py's writing)."""
    start = html.index(b'id="attnscope-payload">') + len(b'id="attnscope-payload">')
    raw = html[start: html.index(b"</script>", start)]
    data = gzip.decompress(re.sub(rb"=(.)", lambda m: bytes([(m[1][0] - 64) & 0xFF]), raw, flags=re.DOTALL))
    length = int.from_bytes(data[:4], "big")
    return json.loads(data[4: 4 + length]), data[4 + length:]


def outside_payload(html: bytes) -> str:
    start = html.index(b'id="attnscope-payload">')
    return (html[:start] + html[html.index(b"</script>", start):]).decode("ascii")


TINY = load_model("attnscope-tiny", "bundled:attnscope-tiny")


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    app = create_app(Settings(models={}, default_model="attnscope-tiny"),
                     make_engine({"attnscope-tiny": TINY}, "attnscope-tiny"))
    with TestClient(app, base_url="http://localhost") as c:
        yield c


def text_of(n: int, source: str = SENTENCE) -> str:
    """A beginning of ``source`` (repeated) of exactly n tokens of the bundled model."""
    ids = TINY.tokenizer(source * (2 * n // len(source.split()) + 2))["input_ids"]
    for k in range(n, n + 8):  # a cut inside a word can tokenize into fewer pieces
        text = str(TINY.tokenizer.decode(ids[:k]))
        if len(TINY.tokenizer(text)["input_ids"]) == n:
            return text
    raise AssertionError(f"no beginning of {source[:20]!r} of {n} tokens")


def analysed(client: TestClient, n: int) -> dict[str, Any]:
    run: dict[str, Any] = client.post("/api/runs", json={"text": text_of(n)}).json()
    assert len(run["tokens"]) == n, len(run["tokens"])
    return run


STORY = ("Once upon a time, in a small village near the mountains, there lived an old carpenter who built chairs "
         "for everyone. Every morning he walked to the river, listened to the birds, and thought about the shape of "
         "wood. His daughter wanted to become a sailor and see the world beyond the hills.")


def test_a_64_token_run_is_one_file_under_2_mb_with_every_head_said_before_the_download(client: TestClient) -> None:
    run = client.post("/api/runs", json={"text": text_of(64, STORY)}).json()  # prose: measured 1.985-1.990 MB
    assert len(run["tokens"]) == 64
    url = f"/api/runs/{run['run_id']}/export?format=html"
    ahead = client.get(url + "&dry_run=1").json()
    r = client.get(url)
    assert r.status_code == 200 and r.headers["content-type"] == "text/html; charset=windows-1252"
    assert r.headers["content-disposition"] == f'attachment; filename="attnscope-run-{run["run_id"]}.html"'
    assert len(r.content) < TWO_MB, len(r.content)
    assert ahead == {"bytes": len(r.content), "exact_heads": "all", "overview_heads": "", "every_head": True}
    assert r.headers["x-attnscope-exact-heads"] == "all"
    manifest, blobs = decoded(r.content)
    assert set(manifest["exact"]) == {f"{layer}.{head}" for layer in range(6) for head in range(8)}
    _, size = manifest["exact"]["4.0"]
    assert size == 4 * 64 * 65 // 2  # one float32 a visible cell
    assert manifest["run"] == {"run_id": run["run_id"], "n": 64, "n_layers": 6, "n_heads": 8, "causal": True,
                               "text": run["text"], "model": "attnscope-tiny", "every_head": True,
                               "overview": []}
    saved = json.loads(blobs[slice(*_span(manifest["responses"]["POST /api/runs?"]["body"]))])
    assert saved["run_id"] == run["run_id"] and not saved["scores_pending"]  # late scores in
    models = json.loads(blobs[slice(*_span(manifest["responses"]["GET /api/models?"]["body"]))])["models"]
    assert [(m["name"], m["default"]) for m in models] == [("attnscope-tiny", True)]  # not the server's others
    nexts = [k for k in manifest["responses"] if "/next?" in k]
    assert len(nexts) == 64  # every position's next-token distribution
    assert not [k for k in manifest["responses"] if "/attention?" in k]  # derived in the page from the exact cells


def _span(where: list[int]) -> tuple[int, int]:
    return where[0], where[0] + where[1]


def test_the_file_asks_nothing_of_a_server_or_a_cdn(client: TestClient) -> None:
    html = client.get(f"/api/runs/{analysed(client, 20)['run_id']}/export?format=html&lang=zh").content
    page = outside_payload(html)
    start = html.index(b'id="attnscope-payload">') + len(b'id="attnscope-payload">')
    raw = html[start: html.index(b"</script>", start)]
    assert b"\r" not in raw and b"</" not in raw and b"<!" not in raw  # nothing the HTML parser would change or end
    assert '<meta charset="windows-1252">' in page[:1024]  # where a browser looks for it
    assert not re.search(r"<(script|link|img|iframe|source)\b[^>]*\b(src|href)=", page)  # no script, style or image
    assert "@import" not in page and "url(" not in page
    manifest, blobs = decoded(html)
    assert "attnscope/js/main.js" in manifest["modules"] and "attnscope/i18n/zh.js" in manifest["modules"]
    assert not [m for m in manifest["modules"] if "/learn/" in m]  # the explorer's modules only
    assert blobs[slice(*_span(manifest["plotly"]))].startswith(b"/**")  # plotly.js itself
    assert "lang=zh" in page  # the page opens in the language asked for


def test_above_the_budget_every_heads_thumbnail_and_the_chosen_heads_exact_cells(client: TestClient) -> None:
    run = analysed(client, 300)  # 48 heads x 45,150 cells x 4 bytes: 8.7 MB, over the budget
    url = f"/api/runs/{run['run_id']}/export?format=html"
    assert client.get(url + "&dry_run=1").json()["exact_heads"] == "0.0"  # by default, the first head
    ahead = client.get(url + "&heads=4.0,2.3&dry_run=1").json()
    r = client.get(url + "&heads=4.0,2.3")
    assert ahead == {"bytes": len(r.content), "exact_heads": "4.0,2.3", "overview_heads": "4.0,2.3", "every_head": False}
    assert r.headers["x-attnscope-exact-heads"] == "4.0,2.3"
    manifest, _ = decoded(r.content)
    assert set(manifest["exact"]) == {"4.0", "2.3"}
    tiles = sorted(k for k in manifest["responses"] if "/attention?" in k)
    assert len(tiles) == 6 and all("format=bin" in k and "head=" not in k and "size=64" in k for k in tiles)
    # every head's thumbnails, by layer; the kept heads' overview tiles and zooms the page derives from their cells
    assert len(r.content) < len(client.get(url + "&heads=" + ",".join(f"{h}.0" for h in range(6))).content)


def test_heads_that_are_not_the_runs_are_refused(client: TestClient) -> None:
    url = f"/api/runs/{analysed(client, 100)['run_id']}/export?format=html"
    for bad in ("6.0", "0.8", "x", ",", "1.2.3"):
        r = client.get(url + f"&heads={bad}")
        assert r.status_code == 422 and r.json()["code"] == "bad_input", (bad, r.text)
    assert client.get("/api/runs/no-such-run/export?format=html").status_code == 404


def test_exact_cells_as_far_as_the_cap_holds_them_then_the_overview_alone(client: TestClient,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(standalone, "HEADS_CAP", 4 * 5050 * 2)  # two heads of 100 tokens
    url = f"/api/runs/{analysed(client, 100)['run_id']}/export?format=html&dry_run=1"
    assert client.get(url + "&heads=0.3,0.1,0.2").json()["exact_heads"] == "0.3,0.1"  # in the order asked
    # a long run whose one head is over the cap (a 16k-token head alone is 537 MB): the first head's overview
    # tile and the last query's exact row, what the page opens on
    run = analysed(client, 300)
    r = client.get(f"/api/runs/{run['run_id']}/export?format=html&heads=2.1,3.3")
    manifest, _ = decoded(r.content)
    assert r.headers["x-attnscope-exact-heads"] == "" and manifest["exact"] == {}
    asked = [dict(parse_qsl(k.partition("?")[2])) for k in manifest["responses"] if "/attention?" in k and "head=" in k]
    assert sorted((a["layer"], a["head"], a.get("size", "-"), a["q0"]) for a in asked) == [
        ("2", "1", "-", "299"), ("2", "1", "256", "0")]  # the cap holds no second overview: the first head's alone


def test_save_html_through_the_python_door(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = BUNDLED_DIR / "attnscope-tiny"
    scope = attnscope.Scope(AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder))
    run = scope.run("The cat sat on the mat. The cat sat on the mat.")
    path = run.save_html(tmp_path / "run.html")
    assert path == tmp_path / "run.html" and list(tmp_path.iterdir()) == [path]  # no partial file left
    html = path.read_bytes()
    assert html.startswith(b"<!doctype html>") and len(html) < TWO_MB
    manifest, _ = decoded(html)
    assert manifest["run"]["text"] == run.text and manifest["run"]["every_head"]
    other = attnscope.save_html(run, tmp_path / "two-heads.html", heads="1.2,5.7", lang="zh")
    manifest, _ = decoded(other.read_bytes())
    assert set(manifest["exact"]) == {"1.2", "5.7"}

    async def in_a_notebook() -> Path:  # a cell runs inside the kernel's event loop
        return run.save_html(tmp_path / "from-a-loop.html", heads="0.0")

    with ThreadPoolExecutor(1) as pool:  # a thread of its own: the test's thread may hold another loop
        saved = pool.submit(asyncio.run, in_a_notebook()).result()
    assert decoded(saved.read_bytes())[0]["exact"].keys() == {"0.0"}


def test_an_encoders_file_keeps_its_full_attention_and_asks_no_next_token(encoder: LoadedModel) -> None:
    app = create_app(Settings(models={}, default_model="minilm-l6"), make_engine({"minilm-l6": encoder}, "minilm-l6"))
    with TestClient(app, base_url="http://localhost") as c:
        run = c.post("/api/runs", json={"text": "The cat sat on the mat."}).json()
        manifest, _ = decoded(c.get(f"/api/runs/{run['run_id']}/export?format=html").content)
    n = len(run["tokens"])
    assert manifest["run"]["causal"] is False and manifest["run"]["every_head"]
    assert {size for _, size in manifest["exact"].values()} == {4 * n * n}  # every key of every row
    assert not [k for k in manifest["responses"] if "/next?" in k]  # an encoder has no next-token chart


def test_the_files_modules_are_the_explorers_code_without_its_comment_lines() -> None:
    from attnscope.app.standalone import explorer_modules, without_comment_lines

    for name, source in explorer_modules().items():
        ticks = 0
        for line in source.split("\n"):  # no comment-looking line inside a template literal: safe to leave out
            if line.lstrip().startswith("//"):
                assert ticks % 2 == 0, (name, line)
            ticks += line.count("`")
        kept = without_comment_lines(source)
        code = [line for line in source.split("\n") if not line.lstrip().startswith("//")]
        assert kept.split("\n") == code or kept.split("\n") == [*code[:-1], code[-1]], name  # every code line, in order
    assert without_comment_lines("a();\n  // why\nb(); // stays\n//\n") == "a();\nb(); // stays\n"
