"""Memory: the run store reports what it holds, and freed activations go back to the system."""

from __future__ import annotations

import subprocess
import sys

from fastapi.testclient import TestClient

# Allocates 2,000 tensors of 100 kB, each followed by a small object that is kept, frees the
# tensors and prints how far the process's RSS stayed above where it started (MiB). Under
# glibc's defaults the tensors sit in the heap between the kept objects, which pins them.
FRAGMENT = """
import sys, torch
from attnscope.app.memory import rss_bytes, tune_malloc
if sys.argv[1] == "tuned":
    assert tune_malloc()
torch.zeros(1)
before = rss_bytes()
big, keep = [], []
for i in range(2000):
    big.append(torch.ones(25_000))  # 100 kB
    keep.append(torch.ones(64))
del big
print((rss_bytes() - before) / 2**20)
"""


def rss_growth(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", FRAGMENT, mode], check=True, capture_output=True, text=True)
    return float(out.stdout.strip())


def test_tuned_malloc_returns_freed_tensors() -> None:
    default, tuned = rss_growth("default"), rss_growth("tuned")
    assert default > 100, default  # the 200 MB of freed tensors stay resident
    assert tuned < 20, tuned  # they were returned; what stays is the kept objects
    assert tuned < default / 5


def test_health_reports_the_run_cache(client: TestClient) -> None:
    before = client.get("/api/health").json()
    assert before["status"] == "ok" and "tiny-gpt2" in before["models"]
    assert before["run_cache_max_bytes"] == client.app.state.engine.store.max_bytes
    run = client.post("/api/runs", json={"text": "dog bites man", "model": "tiny-gpt2"}).json()
    after = client.get("/api/health").json()
    cache = client.app.state.engine.run(run["run_id"])
    assert after["runs"] == len(client.app.state.engine.store) >= 1
    assert after["run_cache_bytes"] == client.app.state.engine.store.nbytes
    assert after["run_cache_bytes"] >= cache.nbytes > 0
    assert after["rss_bytes"] > 100 * 2**20  # a process with torch and a model loaded
