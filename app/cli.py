"""``attnscope serve``, ``attnscope open``, ``attnscope analyze`` and ``attnscope export``."""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import sys
import threading
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from attnscope.app.runjson import RunBody
    from attnscope.app.settings import Settings
    from attnscope.model.results import PositionPrediction
    from attnscope.model.runs.record import RunRecord

log = logging.getLogger("attnscope")


def model_overrides(items: list[str]) -> dict[str, Any]:
    """``--model NAME=SOURCE`` (repeatable): exactly these models, the first the default;
    ``--model SOURCE`` for a source that names itself (``smollm2-135m``, a ``.gguf`` file,
    ``ollama:MODEL[:TAG]``): the same, under that name; ``--model NAME`` alone: the default among
    the configured (or given) ones."""
    from attnscope.model.load.sources import bare_name

    models: dict[str, str] = {}
    default: str | None = None
    for item in items:
        name, eq, source = (part.strip() for part in item.partition("="))
        if not eq and (own := bare_name(name)) is not None:
            name, source, eq = own, name, "="
        if not eq:
            default = name
            continue
        if not name or not source:
            raise ValueError(f"--model {item!r}: write NAME=SOURCE (a folder, bundled:NAME, package:MODULE "
                             "or a hub id)")
        if name in models:
            raise ValueError(f"--model: the name {name!r} is given twice")
        models[name] = source
    out: dict[str, Any] = {}
    if models:
        out["models"] = models
        out["default_model"] = default or next(iter(models))
    elif default is not None:
        out["default_model"] = default
    return out


def _settings(args: argparse.Namespace) -> Settings | None:
    """The settings of ``serve`` and ``open``: the environment, then the command line (None: said why)."""
    from attnscope.app.settings import Settings

    overrides: dict[str, Any] = {"host": args.host, "port": args.port}
    try:
        overrides.update(model_overrides(args.model or []))
    except ValueError as exc:
        sys.stderr.write(f"attnscope: {exc}\n")
        return None
    settings = Settings(**{k: v for k, v in overrides.items() if v is not None})
    if "models" in overrides:  # exactly these: pydantic-settings would merge them into ATTNSCOPE_MODELS
        settings = settings.model_copy(update={"models": overrides["models"], "offer_installed": False})
    return settings


def _serve(args: argparse.Namespace) -> int:
    settings = _settings(args)
    if settings is None:
        return 2
    if args.workers > 1:
        return _serve_workers(settings, args.workers)
    return _serve_one(settings)


def _serve_one(settings: Settings, opened: Path | None = None, browser: bool = False) -> int:
    """One process: load the models before binding (a bad model fails fast), then serve; with ``opened``, a
    run file stored first and the explorer opened on it."""
    import uvicorn

    from attnscope.app.main import build_engine, create_app
    from attnscope.app.memory import tune_malloc
    from attnscope.app.middleware import H11_MAX_EVENT
    from attnscope.model.errors import EngineError
    from attnscope.model.runs.disk import RunDirError
    from attnscope.model.scores import probes
    from attnscope.model.services import files

    logging.getLogger().setLevel(settings.log_level)
    if settings.tune_malloc:
        tune_malloc()  # before any thread or tensor: see app/memory.py
    try:
        engine = build_engine(settings)  # load before binding, so a bad model fails fast
    except (EngineError, RunDirError) as exc:
        sys.stderr.write(f"attnscope: {exc}\n".splitlines()[0] + "\n")
        return 1
    for lm in engine.models.values():
        probes.induction(lm)  # measured before binding: GET /api/models answers at once
    url = f"http://{settings.host}:{settings.port}/"
    if opened is not None:
        try:
            data = opened.read_bytes()
            run_id = files.import_run(engine, data=data, max_bytes=len(data)).run_id
        except OSError as exc:
            sys.stderr.write(f"attnscope: cannot read {opened}: {exc.strerror or exc}\n")
            return 1
        except EngineError as exc:
            sys.stderr.write(f"attnscope: {opened}: {exc}\n".splitlines()[0] + "\n")
            return 1
        url += f"?run={run_id}"
    app = create_app(settings, engine)
    sys.stdout.write(f"attnscope: serving {engine.default} at {url}\n")
    sys.stdout.flush()
    _warn_every_interface(settings)
    if browser:
        import webbrowser

        threading.Timer(1.0, webbrowser.open, args=(url,)).start()  # once the server listens
    # no "server: uvicorn" header: nothing tells a client which server software (and version) answers
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=settings.log_level.lower(),
                server_header=False, h11_max_incomplete_event_size=H11_MAX_EVENT)
    return 0


def _serve_workers(settings: Settings, workers: int) -> int:
    """N processes on one port, each loading the models, sharing the run directory: any worker serves any
    run (read from its file), and a run's late head scores are computed once (a claim on its file)."""
    import uvicorn

    from attnscope.app.middleware import H11_MAX_EVENT
    from attnscope.model.runs.disk import RunDir, RunDirError

    if not settings.run_dir:
        sys.stderr.write("attnscope: --workers needs a run directory (ATTNSCOPE_RUN_DIR) for the workers to share\n")
        return 2
    try:
        RunDir.open(settings.run_dir, settings.run_dir_bytes)
    except RunDirError as exc:
        sys.stderr.write(f"attnscope: {exc}\n")
        return 1
    # the workers read their settings from the environment: the command line's go there
    os.environ["ATTNSCOPE_MODELS"] = json.dumps(settings.models)
    os.environ["ATTNSCOPE_DEFAULT_MODEL"] = settings.default_model
    os.environ["ATTNSCOPE_RUN_DIR"] = settings.run_dir
    os.environ["ATTNSCOPE_HOST"], os.environ["ATTNSCOPE_PORT"] = settings.host, str(settings.port)
    url = f"http://{settings.host}:{settings.port}/"
    sys.stdout.write(f"attnscope: serving {settings.default_model} at {url} with {workers} workers "
                     f"sharing {settings.run_dir}\n")
    sys.stdout.flush()
    _warn_every_interface(settings)
    uvicorn.run("attnscope.app.main:worker_app", factory=True, workers=workers, host=settings.host,
                port=settings.port, log_level=settings.log_level.lower(), server_header=False,
                h11_max_incomplete_event_size=H11_MAX_EVENT)
    return 0


def _warn_every_interface(settings: Settings) -> None:
    if settings.host.strip("[]") in ("0.0.0.0", "::") and not settings.allowed_hosts:
        log.warning("listening on every interface, but answering only to localhost, 127.0.0.1 and [::1]: set "
                    "ATTNSCOPE_ALLOWED_HOSTS to the names clients use to reach this machine")


def _open(args: argparse.Namespace) -> int:
    settings = _settings(args)
    if settings is None:
        return 2
    if not args.file.is_file():
        sys.stderr.write(f"attnscope: {args.file} is not a file\n")
        return 1
    return _serve_one(settings, opened=args.file, browser=not args.no_browser)


def run_file(out: RunBody, record: RunRecord, model_info: dict[str, Any], max_cells: int) -> dict[str, Any]:
    """``analyze --json``: the run (its API fields) in the format of the API's JSON export
    (``attnscope-json/1``, every head's cells as base64 float32), so that ``attnscope analyze ... --json >
    run.json`` then ``attnscope export run.json ...`` works; above ``max_cells`` cells the attention is
    left out, as the API's export refuses it."""
    from attnscope.app.runjson import EXPORT_FORMAT, RUN_JSON, attention_cells, attention_json

    saved: dict[str, Any] = {"format": EXPORT_FORMAT, **RUN_JSON.dump_python(out, mode="json"),
                             "model_info": model_info}
    cells = attention_cells(record)
    if cells > max_cells:
        saved["attention_note"] = (f"{cells:,} attention cells, more than the limit of {max_cells:,} "
                                   "(ATTNSCOPE_MAX_CELLS); GET /api/runs/ID/export?format=safetensors keeps any "
                                   "length")
        return saved
    return {**saved, **attention_json(record)}


def _analyze(args: argparse.Namespace) -> int:
    from attnscope.app.runjson import run_body
    from attnscope.app.settings import Settings
    from attnscope.model.errors import EngineError

    settings = Settings()
    try:
        if args.top_k > settings.max_top_k:
            raise EngineError(f"--top-k {args.top_k} is more than the limit of {settings.max_top_k} "
                              "(ATTNSCOPE_MAX_TOP_K)")
        engine, name = _engine_for(args.model, settings)  # analyze --model smollm2-135m: a source by its name
        lm = engine.model(name)
        result = engine.analyse(args.text, name, args.top_k)
        record = engine.wait_scores(result.run_id, None)  # a command prints every head score, complete
        out = run_body(result.run_id, record)
        saved = run_file(out, record, asdict(lm.info), settings.max_cells) if args.json else None
        engine.close()
    except EngineError as exc:
        sys.stderr.write(f"attnscope: {exc}\n")
        return 1
    if saved is not None:
        if "attention" not in saved:
            sys.stderr.write(f"attnscope: the run's attention is left out of the JSON: {saved['attention_note']}\n")
        sys.stdout.write(json.dumps(saved, indent=1, ensure_ascii=False) + "\n")
    else:
        preds: list[PositionPrediction | None] = list(out.predictions) or [None] * len(out.tokens)
        for tok, pred in zip(out.tokens, preds, strict=True):
            guess = f" -> {pred.top[0].token!r} ({pred.top[0].prob:.2f})" if pred else ""
            sys.stdout.write(f"{tok.index:4d} {tok.id:6d} {tok.text!r}{guess}\n")
    return 0


def _engine_for(name: str | None, settings: Any = None) -> tuple[Any, str]:
    """(an Engine on the one model ``name`` names, its name): what ``analyze`` and ``survey`` load. ``name`` a
    configured name, or a source served under its own name (a .gguf file, ollama:MODEL, smollm2-135m)."""
    from attnscope.app.settings import Settings
    from attnscope.model.errors import EngineError
    from attnscope.model.load.models import load_model
    from attnscope.model.load.sources import bare_name
    from attnscope.model.runs.record import RunStore
    from attnscope.model.services.engine import Engine

    settings = settings if settings is not None else Settings()
    chosen = name or settings.default_model
    if chosen not in settings.models and (own := bare_name(chosen)) is not None:
        settings = settings.model_copy(update={"models": {**settings.models, own: chosen}})
        chosen = own
    if chosen not in settings.models:
        raise EngineError(f"unknown model {chosen!r}; configured models: {', '.join(settings.models)}")
    lm = load_model(chosen, settings.models[chosen], settings.placement())
    return Engine({chosen: lm}, chosen, RunStore(settings.run_store_bytes), settings.max_tokens,
                  forward_bytes=settings.forward_bytes), chosen


def _bar(p: Any) -> None:
    """One line on stderr, rewritten in place: documents, tokens, the file's share read, the rate."""
    share = f"{p.fraction:6.1%} of the file, " if p.fraction is not None else ""
    sys.stderr.write(f"\rsurvey: {share}{p.documents:,} documents, {p.sequences:,} windows, {p.tokens:,} tokens, "
                     f"{p.tokens_per_s:,.0f} tokens/s   ")
    sys.stderr.flush()


def _survey(args: argparse.Namespace) -> int:
    from attnscope.model.errors import EngineError
    from attnscope.model.services.survey import survey

    out = args.out or args.file.with_suffix(".survey.safetensors")
    try:
        engine, _name = _engine_for(args.model)
        result = survey(engine, path=args.file, max_tokens=args.max_tokens, top_k=args.top_k, out=out,
                        resume=args.resume, progress=None if args.quiet else _bar)
        engine.close()
    except EngineError as exc:
        sys.stderr.write(f"\nattnscope: {exc}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write(f"\nattnscope: stopped; `attnscope survey {args.file} --resume` continues from {out}\n")
        return 130
    if not args.quiet:
        sys.stderr.write("\n")
    fields = ("prev_token", "first_token", "induction", "self_attention")
    def strength(h: Any, f: str) -> float:
        mean = getattr(h, f).mean
        return float(mean) if mean is not None else -1.0

    top = {f: max(result.heads, key=functools.partial(strength, f=f)) for f in fields}
    sys.stdout.write(f"{result.documents:,} documents, {result.sequences:,} windows, {result.tokens:,} tokens "
                     f"on {result.model}; wrote {out}\n")
    for f, h in top.items():
        stat = getattr(h, f)
        if stat.mean is not None:
            sys.stdout.write(f"  strongest {f}: L{h.layer}H{h.head} {stat.mean:.3f} ± {stat.std or 0.0:.3f} "
                             f"over {stat.count:,} windows\n")
    return 0


def _export(args: argparse.Namespace) -> int:
    from attnscope.app.encoding import rows_from_f32_base64
    from attnscope.app.svg_export import heatmap_svg

    try:
        run = json.loads(args.run.read_text(encoding="utf-8"))
        attention = run["attention"]
    except KeyError:
        note = run.get("attention_note") if isinstance(run, dict) else None
        sys.stderr.write(f"attnscope: {args.run} holds no attention" + (f" ({note})" if note else "") +
                         ": save it with `attnscope analyze TEXT --json > run.json`, the explorer's Run JSON "
                         "button or GET /api/runs/ID/export\n")
        return 1
    except (OSError, ValueError, TypeError) as exc:
        sys.stderr.write(f"attnscope: {args.run} is not a run exported by attnscope ({exc})\n")
        return 1
    if not 0 <= args.layer < len(attention) or not 0 <= args.head < len(attention[0]):
        sys.stderr.write(f"attnscope: layer/head out of range: layers 0..{len(attention) - 1}, "
                         f"heads 0..{len(attention[0]) - 1}\n")
        return 1
    tokens = [t["text"] for t in run["tokens"]]
    head = attention[args.layer][args.head]
    # attnscope-json/1 (attnscope-run/2 before it was renamed): exact float32 cells
    if run.get("attention_encoding") == "f32-le-base64":
        try:
            head = rows_from_f32_base64(head, len(tokens), run["causal"])
        except ValueError as exc:
            sys.stderr.write(f"attnscope: {args.run}: {exc}\n")
            return 1
    title = f"{run['model']} · layer {args.layer} head {args.head} · {len(tokens)} tokens"
    args.svg.write_text(heatmap_svg(head, tokens, run["causal"], title), encoding="utf-8")
    sys.stdout.write(f"attnscope: wrote {args.svg}\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    return {"serve": _serve, "open": _open, "analyze": _analyze, "export": _export,
            "survey": _survey}[args.command](args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnscope", description="see inside a transformer")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="start the web app")
    opener = sub.add_parser("open", help="serve a run file (Download run) and open the explorer on it")
    opener.add_argument("file", type=Path)
    opener.add_argument("--no-browser", action="store_true", help="only print the URL")
    for command in (serve, opener):
        command.add_argument("--host", default=None, help="default 127.0.0.1")
        command.add_argument("--port", type=int, default=None, help="default 8000")
        command.add_argument("--model", action="append", default=None, metavar="NAME[=SOURCE]",
                             help="NAME=SOURCE serves exactly the models given (repeatable; the first is the default; "
                                  "SOURCE is a local folder, a .gguf file, ollama:MODEL[:TAG], smollm2-135m, "
                                  "bundled:NAME, package:MODULE or a hub id such as Qwen/Qwen2.5-0.5B-Instruct); "
                                  "a .gguf file, ollama:MODEL or smollm2-135m alone is served under its own name; "
                                  "NAME alone picks the default among ATTNSCOPE_MODELS")
    serve.add_argument("--workers", type=int, default=1,
                       help="processes on one port sharing ATTNSCOPE_RUN_DIR (each loads the models)")
    analyze = sub.add_parser("analyze", help="analyse one prompt and print the run")
    analyze.add_argument("text")
    analyze.add_argument("--model", default=None, metavar="NAME|SOURCE",
                         help="a configured name, or a .gguf file, ollama:MODEL[:TAG] or smollm2-135m")
    analyze.add_argument("--top-k", type=int, default=5)
    analyze.add_argument("--json", action="store_true",
                         help="print the run as JSON, every head's attention included (the export format): "
                              "`> run.json` saves it for `attnscope export`")
    surveyor = sub.add_parser("survey", help="every head's statistics and top examples over a corpus file")
    surveyor.add_argument("file", type=Path, help="plain text (documents between blank lines) or JSON Lines "
                                                   "(a string field \"text\" a line)")
    surveyor.add_argument("--model", default=None, metavar="NAME|SOURCE",
                          help="a configured name, or a .gguf file, ollama:MODEL[:TAG] or smollm2-135m")
    surveyor.add_argument("--out", type=Path, default=None,
                          help="the survey file (default: FILE.survey.safetensors); the explorer and "
                               "attnscope.load open it")
    surveyor.add_argument("--max-tokens", type=int, default=512, help="window length: longer documents are cut")
    surveyor.add_argument("--top-k", type=int, default=5, help="examples kept per head")
    surveyor.add_argument("--resume", action="store_true", help="continue a stopped survey from --out")
    surveyor.add_argument("--quiet", action="store_true", help="no progress line")
    export = sub.add_parser("export", help="draw one head of an exported run (Run JSON) as SVG")
    export.add_argument("run", type=Path,
                        help="a file saved with the explorer's Run JSON button (or GET /api/runs/ID/export)")
    export.add_argument("--layer", type=int, required=True)
    export.add_argument("--head", type=int, required=True)
    export.add_argument("--svg", type=Path, required=True, help="where to write the figure")
    return parser


if __name__ == "__main__":
    raise SystemExit(main())
