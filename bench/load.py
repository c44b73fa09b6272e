"""Load test on loopback: C concurrent clients x R rounds, bounded, stops by itself.

Each round of each client: analyse a distinct prompt (POST /api/runs), fetch two
attention slices (one head as JSON, one layer as bytes) and the residual view. Checks
that every response belongs to its own prompt (no cross-talk), counts errors, reports
p50/p99 latency per request kind, and reads the server's RSS after the run.

    python bench/load.py --write BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
# run as `python bench/x.py`: the repository root goes on sys.path first, so the project's
# imports below must follow it (hence their noqa: E402)
sys.path.insert(0, str(ROOT))

from attnscope.app.memory import rss_bytes  # noqa: E402
from bench.report import write_section  # noqa: E402
from tests.support.servers import free_port  # noqa: E402

log = logging.getLogger("bench.load")
WORDS = ("river", "lamp", "quiet", "seven", "garden", "paper", "winter", "bright", "stone", "music", "cloud", "apple")


def prompt(client: int, rnd: int) -> str:
    """A distinct prompt per (client, round), so a mixed-up response shows."""
    w = [WORDS[(client * 7 + rnd * 3 + k) % len(WORDS)] for k in range(6)]
    return f"Client {client} round {rnd}: the {w[0]} and the {w[1]} near a {w[2]} {w[3]} {w[4]} {w[5]}."


def rss_mb(pid: int) -> float:
    size = rss_bytes(pid)
    return float("nan") if size is None else size / (1 << 20)


async def client_loop(base: str, cid: int, rounds: int, lat: dict[str, list[float]], errors: list[str],
                      stats: dict[str, int], deadline: float) -> None:
    try:
        await _client_rounds(base, cid, rounds, lat, errors, stats, deadline)
    except httpx.HTTPError as exc:  # a transport failure is an error to report, not a crash
        errors.append(f"client {cid}: {type(exc).__name__} on {exc.request.method} {exc.request.url}")


async def _client_rounds(base: str, cid: int, rounds: int, lat: dict[str, list[float]], errors: list[str],
                         stats: dict[str, int], deadline: float) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=60) as http:
        for rnd in range(rounds):
            if time.monotonic() > deadline:
                errors.append(f"client {cid}: time budget exhausted at round {rnd}")
                return
            text = prompt(cid, rnd)
            while True:
                t0 = time.perf_counter()
                r = await http.post("/api/runs", json={"text": text, "top_k": 5})
                if r.status_code == 503:
                    stats["retried_503"] += 1
                    await asyncio.sleep(float(r.headers.get("retry-after", "1")))
                    continue
                break
            lat["analyse"].append(time.perf_counter() - t0)
            if r.status_code != 201:
                errors.append(f"client {cid} round {rnd}: POST /api/runs {r.status_code}")
                continue
            run = r.json()
            if "".join(t["text"] for t in run["tokens"]) != text:
                errors.append(f"client {cid} round {rnd}: tokens of another prompt")
                continue
            rid, n = run["run_id"], len(run["tokens"])
            for kind, url in (("attention_json", f"/api/runs/{rid}/attention?layer=1&head=2"),
                              ("attention_bin", f"/api/runs/{rid}/attention?layer=0&format=bin"),
                              ("residual", f"/api/runs/{rid}/residual")):
                t0 = time.perf_counter()
                r = await http.get(url)
                lat[kind].append(time.perf_counter() - t0)
                if r.status_code != 200:
                    errors.append(f"client {cid} round {rnd}: {url} {r.status_code}")
                    continue
                size = int(r.headers.get("x-attn-n", n)) if kind == "attention_bin" else (r.json()["n"])
                if size != n:
                    errors.append(f"client {cid} round {rnd}: {kind} of a run with {size} tokens, expected {n}")
            stats["rounds"] += 1


async def run_load(base: str, clients: int, rounds: int, budget_s: float) -> tuple[dict[str, list[float]], list[str], dict[str, int], float]:
    lat: dict[str, list[float]] = {k: [] for k in ("analyse", "attention_json", "attention_bin", "residual")}
    errors: list[str] = []
    stats = {"rounds": 0, "retried_503": 0}
    t0 = time.perf_counter()
    deadline = time.monotonic() + budget_s
    await asyncio.gather(*(client_loop(base, c, rounds, lat, errors, stats, deadline) for c in range(clients)))
    return lat, errors, stats, time.perf_counter() - t0


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return 1e3 * xs[min(len(xs) - 1, round(q * (len(xs) - 1)))] if xs else float("nan")


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--cache-mb", type=int, default=256)
    p.add_argument("--budget-s", type=float, default=900, help="stop the load after this long, whatever is left")
    p.add_argument("--no-tune-malloc", action="store_true", help="serve with glibc's malloc defaults (for comparison)")
    p.add_argument("--write", type=Path, default=None)
    args = p.parse_args()
    port = free_port()
    env = {**os.environ, "ATTNSCOPE_RUN_STORE_BYTES": str(args.cache_mb << 20), "HF_HUB_OFFLINE": "1",
           "ATTNSCOPE_MODELS": json.dumps({"attnscope-tiny": "bundled:attnscope-tiny"})}
    if args.no_tune_malloc:
        env["ATTNSCOPE_TUNE_MALLOC"] = "false"
    # the server's output goes to a file: a pipe nobody reads fills up and blocks its access log
    server_log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"attnscope-load-{port}.log", "w")  # noqa: SIM115 - kept open for the server's life, closed in the finally below
    server = subprocess.Popen([sys.executable, "-m", "attnscope", "serve", "--port", str(port)], cwd=ROOT, env=env,
                              stdout=server_log, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                httpx.get(f"{base}/api/models", timeout=2)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        rss_idle = rss_mb(server.pid)
        lat, errors, stats, wall = asyncio.run(run_load(base, args.clients, args.rounds, args.budget_s))
        rss_after = rss_mb(server.pid)
        health = httpx.get(f"{base}/api/health", timeout=10).json()
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        server_log.close()
    requests = sum(len(v) for v in lat.values())
    lines = [f"{args.clients} clients x {args.rounds} rounds on attnscope-tiny (each round: analyse a distinct prompt, "
             f"one head as JSON, one layer as bytes, the residual view); run store capped at {args.cache_mb} MiB.", "",
             f"- requests: {requests} in {wall:.1f} s ({requests / wall:.1f} req/s); rounds completed: {stats['rounds']}; "
             f"**errors: {len(errors)}**; cross-talk: {sum('another prompt' in e or 'expected' in e for e in errors)}; "
             f"503 retries: {stats['retried_503']}",
             f"- server RSS: {rss_idle:.0f} MiB idle with the model loaded, **{rss_after:.0f} MiB after the run**; "
             f"bar: cap {args.cache_mb} MiB of runs + {rss_idle:.0f} MiB = {args.cache_mb + rss_idle:.0f} MiB "
             f"({'met' if rss_after <= args.cache_mb + rss_idle else 'NOT met'})",
             f"- run store after the run (`GET /api/health`): {health['runs']} runs, "
             f"{health['run_cache_bytes'] / (1 << 20):.0f} MiB of the {args.cache_mb} MiB cap; growth beyond it: "
             f"{rss_after - rss_idle - health['run_cache_bytes'] / (1 << 20):.0f} MiB"
             + (" (glibc malloc left at its defaults: `--no-tune-malloc`)" if args.no_tune_malloc else ""), "",
             "| request | p50 (ms) | p99 (ms) | max (ms) |", "|---|---|---|---|"]
    for kind, xs in lat.items():
        lines.append(f"| {kind} | {pct(xs, 0.5):.0f} | {pct(xs, 0.99):.0f} | {1e3 * max(xs) if xs else float('nan'):.0f} |")
    text = "\n".join(lines)
    sys.stdout.write(text + "\n" + "\n".join(errors[:20]) + "\n")
    if args.write:
        write_section(args.write, "load", text, "python bench/load.py --write BENCHMARKS.md")
    if errors:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
