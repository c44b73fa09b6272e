"""Side by side with the peers, in one run: BertViz and TransformerLens against attnscope.

Everything runs on the same random GPT-2-small-shaped model (``GPT2Config()``: 12 layers
x 12 heads, d_model 768, 1,024 positions, seed 0; the bundled tokenizer) and the same
prompts of n = 64, 256 and 1,024 tokens cut from held-out English:

* **capture** — alternated R times, medians: a bare eager forward; attnscope's capture
  (``model.capture.forward.run_with_cache``: every head's pattern, the residual stream, attention
  and MLP outputs, logits); attnscope's whole analysis (``Engine.analyse``: the capture plus
  head scores and the next-token top-k at every position); TransformerLens'
  ``run_with_cache`` (``TransformerBridge`` over a second copy of the same weights, every
  hook cached, its default).
* **payload** — BertViz ``head_view(..., html_action="return")`` (the forward with
  ``output_attentions`` plus building its HTML: time and size) against attnscope's
  ``POST /api/runs`` plus one head's binary slice (time and size). BertViz's HTML is built
  in a child process with a memory cap (``--bertviz-mem-gb``) and a time limit, so a
  prompt it cannot handle is reported, not fatal.
* **page** — in headless Chromium (Debian's, driven by Playwright): BertViz's HTML opened
  from disk (its require.js, d3 and jQuery, which it loads from a CDN, are answered from
  npm packages fetched at set-up) until its SVG is drawn, against attnscope's explorer:
  click Analyse until the heatmap is drawn. Both with a time limit (``--page-timeout``).

The peers are never the app's dependencies: they are the ``peers`` extra, installed into a
throwaway virtual environment with the CPU build of torch::

    python3 bench/peers.py --setup /tmp/attnscope-peers     # venv + installs + npm packages
    /tmp/attnscope-peers/bin/python bench/peers.py --assets /tmp/attnscope-peers/assets --write BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import multiprocessing as mp
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
# run as `python bench/x.py`: the repository root goes on sys.path first, so the project's
# imports below must follow it (hence their noqa: E402)
sys.path.insert(0, str(ROOT))

from attnscope.model.capture.names import act_name  # noqa: E402
from attnscope.model.load.models import LoadedModel  # noqa: E402
from bench.capture import gpt2_small_folder, prompt_of  # noqa: E402
from bench.report import publish, write_section  # noqa: E402

log = logging.getLogger("bench.peers")
# what BertViz's page asks the CDN for, and the npm package file that answers it
CDN_ASSETS = {
    "require.min.js": ("requirejs@2.3.6", "package/require.js"),
    "d3.min.js": ("d3@5.7.0", "package/dist/d3.min.js"),
    "jquery.min.js": ("jquery@2.2.4", "package/dist/jquery.min.js"),
}


# ---- set-up ------------------------------------------------------------------------------
def setup(venv: Path) -> None:
    """A throwaway venv with torch (CPU), attnscope and its [peers] extra; npm assets beside it."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin/python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "torch==2.13.0"], check=True)  # the CPU build first, as scripts/dev.sh does
    subprocess.run([*pip, "-e", f"{ROOT}[dev,peers]"], check=True)
    assets = venv / "assets"
    assets.mkdir(exist_ok=True)
    for name, (package, member) in CDN_ASSETS.items():
        with tempfile.TemporaryDirectory() as tmp:
            out = subprocess.run(["npm", "pack", package, "--silent"], cwd=tmp, check=True,
                                 capture_output=True, text=True).stdout.split()[-1]
            subprocess.run(["tar", "-xzf", out, member], cwd=tmp, check=True)
            (assets / name).write_bytes((Path(tmp) / member).read_bytes())
    log.info("set up %s; now run: %s/bin/python bench/peers.py --assets %s --write BENCHMARKS.md", venv, venv, assets)


# ---- capture -----------------------------------------------------------------------------
def timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure_capture(lm: LoadedModel, folder: Path, texts: dict[int, str], repeats: int) -> list[dict[str, float]]:
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import GPT2LMHeadModel

    from attnscope.model.capture.forward import run_with_cache
    from attnscope.model.runs.record import RunStore
    from attnscope.model.services.engine import Engine

    engine = Engine({lm.info.name: lm}, lm.info.name, RunStore(1 << 30), 1024)  # LRU: one big run at a time
    # TransformerLens wraps the modules of the model it is given: a second copy of the same weights
    hf = GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager").eval()
    bridge = TransformerBridge.boot_transformers("gpt2", hf_model=hf, tokenizer=lm.tokenizer)
    rows = []
    for n, text in texts.items():
        ids = torch.tensor(lm.tokenizer(text)["input_ids"])  # (n,)
        assert ids.shape[0] == n
        with torch.inference_mode():
            ref = lm.model(input_ids=ids[None], output_attentions=True).attentions[-1][0]  # (H, n, n)
        _, tl_cache = bridge.run_with_cache(ids[None])
        assert torch.allclose(tl_cache[act_name("pattern", lm.info.n_layers - 1)][0], ref, atol=1e-5)
        del tl_cache
        steps = {
            # default arguments bind this iteration's prompt (the lambdas run inside it anyway)
            "bare": lambda ids=ids: _bare(lm.model, ids),
            "capture": lambda ids=ids: run_with_cache(lm, ids),
            "analyse": lambda text=text: engine.analyse(text, lm.info.name, 10),
            "transformer_lens": lambda ids=ids: bridge.run_with_cache(ids[None]),
        }
        times: dict[str, list[float]] = {k: [] for k in steps}
        for rep in range(repeats + 1):  # the first round warms up and is dropped
            for key, fn in steps.items():
                t = timed(fn)
                if rep:
                    times[key].append(t)
        med = {k: 1e3 * statistics.median(v) for k, v in times.items()}
        row = {"n": n, **{f"{k}_ms": v for k, v in med.items()}}
        log.info("capture n=%d: %s", n, ", ".join(f"{k} {v:.0f} ms" for k, v in med.items()))
        rows.append(row)
    return rows


def side_by_side(lm: LoadedModel, arch: str, texts: dict[int, str], repeats: int) -> list[dict[str, Any]]:
    """Issue 39's comparison on one model, alternated ``repeats`` times (a first round dropped), medians:
    a plain SDPA forward (the physical limit), transformers' eager forward with ``output_attentions``,
    attnscope's analyse → its response and analyse → every exact head score in, TransformerLens'
    ``run_with_cache``. Each runs on its own copy of the same weights (TransformerLens wraps the modules
    of the model it is given); after each analyse its background scores finish before the next step."""
    import copy

    from transformer_lens.model_bridge import TransformerBridge

    from attnscope.model.runs.record import RunStore
    from attnscope.model.services.engine import Engine

    name = lm.info.name
    engine = Engine({name: lm}, name, RunStore(1 << 30), max(texts))  # LRU: one run at a time (TransformerLens needs the memory)
    sdpa = copy.deepcopy(lm.model).eval()
    sdpa.set_attn_implementation("sdpa")
    eager = copy.deepcopy(lm.model).eval()
    eager.set_attn_implementation("eager")
    tl_model = copy.deepcopy(eager)
    bridge = TransformerBridge.boot_transformers(arch, hf_model=tl_model, tokenizer=lm.tokenizer)

    def analyse(text: str, scores: bool) -> float:
        """Seconds to the response (``scores``: to every exact score in); the server idle after it."""
        t0 = time.perf_counter()
        result = engine.analyse(text, name, 10)
        answered = time.perf_counter() - t0
        engine.wait_scores(result.run_id, None)  # the background sweep: finished before the next step
        return time.perf_counter() - t0 if scores else answered

    rows = []
    for n, text in texts.items():
        ids = torch.tensor(lm.tokenizer(text)["input_ids"])  # (n,)
        assert ids.shape[0] == n
        with torch.inference_mode():
            ref = eager(input_ids=ids[None], output_attentions=True, use_cache=False).attentions[-1][0]  # (H, n, n)
        _, tl_cache = bridge.run_with_cache(ids[None])
        assert torch.allclose(tl_cache[act_name("pattern", lm.info.n_layers - 1)][0], ref, atol=1e-4)
        del tl_cache, ref
        steps = {
            "sdpa": lambda ids=ids: _bare(sdpa, ids),
            "eager_attentions": lambda ids=ids: _bare(eager, ids, output_attentions=True),
            "analyse": lambda text=text: analyse(text, False),
            "analyse_scores": lambda text=text: analyse(text, True),
            "transformer_lens": lambda ids=ids: bridge.run_with_cache(ids[None]),
        }
        times: dict[str, list[float]] = {k: [] for k in steps}
        for rep in range(repeats + 1):  # the first round warms up and is dropped
            for key, fn in steps.items():
                t = fn() if key.startswith("analyse") else timed(fn)
                if rep:
                    times[key].append(t)
        row: dict[str, Any] = {"model": name, "n": n, **{f"{k}_ms": 1e3 * statistics.median(v) for k, v in times.items()}}
        log.info("%s n=%d: %s", name, n, ", ".join(f"{k} {1e3 * statistics.median(v):.0f} ms" for k, v in times.items()))
        rows.append(row)
    engine.close()
    return rows


def side_by_side_table(rows: list[dict[str, Any]]) -> str:
    lines = ["Median ms of one run, each alternated with the others; in brackets the ratio to the plain SDPA "
             "forward of the same model and prompt (the physical limit). 'analyse' is attnscope's "
             "`engine.analyse` to its response (the capture, the scores that come with it, the next-token "
             "top-k at every position); '+ exact scores' waits for every head's exact entropy, max, "
             "previous-token, first-token and induction scores too.", "",
             "| model | n | SDPA forward | transformers eager + output_attentions | attnscope analyse → response "
             "| attnscope analyse + every exact score | TransformerLens run_with_cache |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        b = r["sdpa_ms"]
        cell = lambda k, b=b, r=r: f"{r[k]:,.0f} ({r[k] / b:.2f}x)"  # noqa: E731
        lines.append(f"| {r['model']} | {r['n']:,} | {b:,.0f} | {cell('eager_attentions_ms')} | **{cell('analyse_ms')}** "
                     f"| **{cell('analyse_scores_ms')}** | {cell('transformer_lens_ms')} |")
    return "\n".join(lines)


def side_by_side_main(keys: list[str], lengths: list[int], repeats: int, tmp: Path, write: Path | None) -> None:
    from bench.browser import served_model  # the models --vs-analyse serves, loaded the same way

    rows = []
    for key in keys:
        if key not in ARCHITECTURES:
            raise SystemExit(f"--side-by-side: unknown model {key!r} ({', '.join(ARCHITECTURES)})")
        lm = served_model(key, tmp)
        texts = {n: prompt_of(lm.tokenizer, n) for n in lengths if n <= lm.info.max_positions}
        rows += side_by_side(lm, ARCHITECTURES[key], texts, repeats)
        del lm
    publish([side_by_side_table(rows)], write, "peers-capture",
            f"python bench/peers.py --side-by-side {','.join(keys)} --lengths {','.join(map(str, lengths))} "
            f"--repeats {repeats} --write BENCHMARKS.md")


ARCHITECTURES = {"gpt2-small": "gpt2", "smollm2": "llama"}  # --side-by-side's models: TransformerLens' name for each


def _bare(model: torch.nn.Module, ids: torch.Tensor, output_attentions: bool = False) -> None:
    with torch.inference_mode():
        model(input_ids=ids[None], use_cache=False, output_attentions=output_attentions)


# ---- payload -----------------------------------------------------------------------------
def _bertviz_child(folder: str, text: str, out: str, mem_gb: float, queue: Any) -> None:
    """In a child process: forward with attentions, then BertViz's HTML, under a memory cap."""
    cap = int(mem_gb * (1 << 30))
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    try:
        from bertviz import head_view
        from transformers import AutoTokenizer, GPT2LMHeadModel

        tok = AutoTokenizer.from_pretrained(folder)
        model = GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager").eval()
        ids = torch.tensor([tok(text)["input_ids"]])
        t0 = time.perf_counter()
        with torch.inference_mode():
            attentions = model(ids, output_attentions=True).attentions
        html = head_view(attentions, tok.convert_ids_to_tokens(ids[0]), html_action="return").data
        seconds = time.perf_counter() - t0
        Path(out).write_text(html, encoding="utf-8")
        queue.put({"ok": True, "seconds": seconds, "bytes": len(html.encode("utf-8"))})
    except MemoryError:
        queue.put({"ok": False, "why": f"MemoryError under a {mem_gb:g} GB cap"})
    except Exception as exc:  # noqa: BLE001 - whatever BertViz raises is what we report
        queue.put({"ok": False, "why": f"{type(exc).__name__}: {str(exc)[:120]}"})


def bertviz_html(folder: Path, text: str, out: Path, mem_gb: float, timeout: float) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_bertviz_child, args=(str(folder), text, str(out), mem_gb, queue))
    t0 = time.perf_counter()
    child.start()
    child.join(timeout)
    if child.is_alive():
        child.kill()
        child.join()
        return {"ok": False, "why": f"not done after {timeout:.0f} s"}
    if queue.empty():
        return {"ok": False, "why": f"the process died (exit code {child.exitcode}) after {time.perf_counter() - t0:.0f} s"}
    return queue.get()


def measure_ours_payload(client: Any, text: str, n: int) -> dict[str, float]:
    t0 = time.perf_counter()
    r = client.post("/api/runs", json={"text": text, "top_k": 10})
    t1 = time.perf_counter()
    assert r.status_code == 201, r.text
    run = r.json()
    assert len(run["tokens"]) == n
    head = client.get(f"/api/runs/{run['run_id']}/attention", params={"layer": 0, "head": 0, "format": "bin"})
    t2 = time.perf_counter()
    assert len(head.content) == n * (n + 1) // 2
    return {"analyse_ms": 1e3 * (t1 - t0), "slice_ms": 1e3 * (t2 - t1), "run_bytes": len(r.content),
            "slice_bytes": len(head.content)}


# ---- pages -------------------------------------------------------------------------------
BERTVIZ_DRAWN = "() => document.querySelectorAll('#vis svg line, #vis svg path').length > 0"


def open_bertviz(browser: Any, html: Path, assets: Path, timeout_s: float) -> dict[str, Any]:
    page = browser.new_page(viewport={"width": 1500, "height": 1100})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)[:120]))
    page.on("crash", lambda _p: errors.append("the tab crashed"))

    def cdn(route: Any) -> None:
        name = route.request.url.rsplit("/", 1)[-1]
        name = name if name.endswith(".js") else name + ".js"
        if (assets / name).exists():
            route.fulfill(path=str(assets / name), content_type="text/javascript")
        else:
            route.abort()

    page.route("https://cdnjs.cloudflare.com/**", cdn)
    t0 = time.perf_counter()
    try:
        page.goto(html.as_uri(), timeout=timeout_s * 1e3, wait_until="load")
        page.wait_for_function(BERTVIZ_DRAWN, timeout=max(1.0, timeout_s - (time.perf_counter() - t0)) * 1e3,
                               polling=200)
        seconds = time.perf_counter() - t0
        elements = page.evaluate("() => document.querySelectorAll('#vis svg *').length")
        heap = page.evaluate("() => performance.memory ? performance.memory.usedJSHeapSize : 0")
        result = {"ok": True, "seconds": seconds, "elements": elements, "heap_mb": heap / (1 << 20)}
    except Exception as exc:  # noqa: BLE001 - a timeout or a crash is the finding
        result = {"ok": False, "why": "; ".join(errors) or f"{type(exc).__name__} after {time.perf_counter() - t0:.0f} s"}
    finally:
        with contextlib.suppress(Exception):  # a crashed tab may refuse to close
            page.close()
    return result


def open_ours(page: Any, text: str) -> float:
    from bench.browser import CLICK_TO_DRAW

    page.fill("[data-testid=prompt-input]", text)
    page.evaluate(CLICK_TO_DRAW)  # warm-up: the first run of this prompt
    return page.evaluate(CLICK_TO_DRAW) / 1e3


# ---- report ------------------------------------------------------------------------------
def tables(capture: list[dict[str, float]], payload: list[dict[str, Any]]) -> str:
    lines = ["**Capture** (median ms; ratio to the bare eager forward of the same run)", "",
             "| n | bare forward | attnscope capture | attnscope analyse (capture + scores + top-k everywhere) "
             "| TransformerLens run_with_cache |", "|---|---|---|---|---|"]
    for r in capture:
        b = r["bare_ms"]
        lines.append(f"| {r['n']} | {b:.0f} | {r['capture_ms']:.0f} (**{r['capture_ms'] / b:.2f}x**) "
                     f"| {r['analyse_ms']:.0f} ({r['analyse_ms'] / b:.2f}x) "
                     f"| {r['transformer_lens_ms']:.0f} ({r['transformer_lens_ms'] / b:.2f}x) |")
    lines += ["", "**Payload and page** (BertViz `head_view(html_action=\"return\")` vs attnscope "
              "`POST /api/runs` + one head's binary slice)", "",
              "| n | BertViz HTML: build time, size | attnscope: analyse + slice time, run JSON + slice size "
              "| one head's slice vs BertViz HTML | BertViz page in Chromium | attnscope explorer: click → heatmap |",
              "|---|---|---|---|---|---|"]
    for r in payload:
        bv, ours = r["bertviz"], r["ours"]
        bv_cell = (f"{1e3 * bv['seconds']:.0f} ms, {bv['bytes'] / 1e6:.1f} MB" if bv["ok"] else f"failed: {bv['why']}")
        ratio = f"**{bv['bytes'] / ours['slice_bytes']:.0f}x smaller**" if bv["ok"] else "—"
        page = r.get("bertviz_page")
        if page is None:
            page_cell = "not opened"
        elif page["ok"]:
            page_cell = (f"drawn after {page['seconds']:.1f} s, {page['elements']:,} SVG elements, "
                         f"JS heap {page['heap_mb']:.0f} MB")
        else:
            page_cell = f"not drawn: {page['why']}"
        mine = r.get("ours_page_s")
        lines.append(f"| {r['n']} | {bv_cell} | {ours['analyse_ms'] + ours['slice_ms']:.0f} ms, "
                     f"{ours['run_bytes'] / 1e3:.0f} kB + {ours['slice_bytes'] / 1e3:.1f} kB | {ratio} | {page_cell} "
                     f"| {f'{1e3 * mine:.0f} ms' if mine is not None else '—'} |")
    return "\n".join(lines)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--setup", type=Path, default=None, help="make this throwaway venv with the peers and stop")
    p.add_argument("--lengths", default="64,256,1024")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--assets", type=Path, default=None, help="require.js, d3 and jQuery for BertViz's page")
    p.add_argument("--bertviz-mem-gb", type=float, default=12.0)
    p.add_argument("--bertviz-timeout", type=float, default=600.0)
    p.add_argument("--page-timeout", type=float, default=120.0)
    p.add_argument("--tmp", type=Path, default=Path("/tmp/attnscope-bench"))
    p.add_argument("--write", type=Path, default=None)
    p.add_argument("--side-by-side", default="", help="comma-separated models (gpt2-small, smollm2): only issue 39's "
                                                       "table (SDPA, eager attentions, analyse, + exact scores, TransformerLens)")
    args = p.parse_args()
    if args.setup:
        setup(args.setup)
        return
    if args.side_by_side:
        torch.set_num_threads(2)
        side_by_side_main(args.side_by_side.split(","), [int(x) for x in args.lengths.split(",")], args.repeats,
                          args.tmp, args.write)
        return
    from fastapi.testclient import TestClient

    from attnscope.app.main import create_app
    from attnscope.app.settings import Settings
    from attnscope.model.load.models import load_model
    from tests.support.tiny import make_engine

    folder = gpt2_small_folder(args.tmp)
    lm = load_model("gpt2-small-random", str(folder))
    texts = {n: prompt_of(lm.tokenizer, n) for n in (int(x) for x in args.lengths.split(","))}
    capture = measure_capture(lm, folder, texts, args.repeats)

    engine = make_engine({lm.info.name: lm}, lm.info.name, store_bytes=8 << 30)
    app = create_app(Settings(models={}, default_model=lm.info.name, max_body_bytes=1 << 24), engine)
    payload: list[dict[str, Any]] = []
    with TestClient(app, base_url="http://localhost") as client:  # a Host the app answers to
        for n, text in texts.items():
            html = args.tmp / f"bertviz-{n}.html"
            bv = bertviz_html(folder, text, html, args.bertviz_mem_gb, args.bertviz_timeout)
            log.info("bertviz n=%d: %s", n, bv)
            payload.append({"n": n, "bertviz": bv, "ours": measure_ours_payload(client, text, n), "html": html})
    if args.assets:
        pages(payload, texts, app, args.assets, args.page_timeout)
    text = tables(capture, payload)
    sys.stdout.write(text + "\n")
    (args.tmp / "peers.json").write_text(json.dumps({"capture": capture, "payload": payload}, default=str, indent=1))
    if args.write:
        write_section(args.write, "peers", text, "python bench/peers.py --assets … --write BENCHMARKS.md")


def pages(payload: list[dict[str, Any]], texts: dict[int, str], app: Any, assets: Path, timeout_s: float) -> None:
    from playwright.sync_api import sync_playwright

    from tests.support.browser import ARGS, CHROMIUM
    from tests.support.servers import serve

    with serve(app) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
        ours = browser.new_page(viewport={"width": 1500, "height": 1100})
        ours.goto(url + "/")
        ours.wait_for_selector("#model-picker option", state="attached")
        for row in payload:
            row["ours_page_s"] = open_ours(ours, texts[row["n"]])
            if row["bertviz"]["ok"]:
                row["bertviz_page"] = open_bertviz(browser, row["html"], assets, timeout_s)
            log.info("page n=%d: ours %.2f s, bertviz %s", row["n"], row["ours_page_s"], row.get("bertviz_page"))
        browser.close()


if __name__ == "__main__":
    main()
