"""``attnscope serve`` and ``attnscope analyze``."""

from __future__ import annotations

import argparse
import json
import logging
import sys

log = logging.getLogger("attnscope")


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from app.main import build_engine, create_app
    from app.settings import Settings
    from model.errors import EngineError

    overrides: dict[str, object] = {"host": args.host, "port": args.port}
    if args.model:
        overrides["default_model"] = args.model
    settings = Settings(**{k: v for k, v in overrides.items() if v is not None})
    try:
        engine = build_engine(settings)  # load before binding, so a bad model fails fast
    except EngineError as exc:
        sys.stderr.write(f"attnscope: {exc}\n".splitlines()[0] + "\n")
        return 1
    app = create_app(settings, engine)
    url = f"http://{settings.host}:{settings.port}/"
    sys.stdout.write(f"attnscope: serving {engine.default} at {url}\n")
    sys.stdout.flush()
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=settings.log_level.lower())
    return 0


def _analyze(args: argparse.Namespace) -> int:
    from app.routes.runs import run_out
    from app.settings import Settings
    from model.cache import RunStore
    from model.engine import Engine
    from model.errors import EngineError
    from model.loading import load_model

    settings = Settings()
    name = args.model or settings.default_model
    try:
        if name not in settings.models:
            raise EngineError(f"unknown model {name!r}; configured models: {', '.join(settings.models)}")
        lm = load_model(name, settings.models[name])
        engine = Engine({name: lm}, name, RunStore(settings.cache_bytes), settings.max_tokens)
        result = engine.analyse(args.text, name, args.top_k)
    except EngineError as exc:
        sys.stderr.write(f"attnscope: {exc}\n")
        return 1
    out = run_out(result.run_id, result.cache)
    if args.json:
        sys.stdout.write(out.model_dump_json(indent=1) + "\n")
    else:
        for tok, pred in zip(out.tokens, out.predictions or [None] * len(out.tokens), strict=True):
            guess = f" -> {pred.top[0].token!r} ({pred.top[0].prob:.2f})" if pred else ""
            sys.stdout.write(f"{tok.index:4d} {tok.id:6d} {tok.text!r}{guess}\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="attnscope", description="see inside a transformer")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="start the web app")
    serve.add_argument("--host", default=None, help="default 127.0.0.1")
    serve.add_argument("--port", type=int, default=None, help="default 8000")
    serve.add_argument("--model", default=None, help="default model name (one of ATTNSCOPE_MODELS)")
    analyze = sub.add_parser("analyze", help="analyse one prompt and print the run")
    analyze.add_argument("text")
    analyze.add_argument("--model", default=None)
    analyze.add_argument("--top-k", type=int, default=5)
    analyze.add_argument("--json", action="store_true", help="print the run as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    return {"serve": _serve, "analyze": _analyze}[args.command](args)


if __name__ == "__main__":
    raise SystemExit(main())
