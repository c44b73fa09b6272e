"""bench/gpu.py, issue 39's one-call GPU table, runs its steps on tiny shapes on the CPU (``--smoke``), so
that the script a lent GPU machine runs is known to run: every row has its ratios, the capture took the
fused kernel on every layer, and the run kept bytes. No timing is asserted."""

from __future__ import annotations

import pytest

from bench import gpu


def test_the_gpu_bench_runs_on_tiny_shapes_on_the_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    rows = gpu.main(["--smoke", "--repeats", "1"])
    assert [r["n"] for r in rows] == ["64", "300"]
    for r in rows:
        assert r["model"] == "smoke-llama (bfloat16)"
        for column in ("capture / SDPA", "analyse → response / SDPA", "analyse + exact scores / SDPA"):
            assert r[column].strip("*").endswith("x") and float(r[column].strip("*x")) > 0
        assert r["attention path"].startswith("attention through the")
        assert r["kept"].endswith("MiB")
    assert "Card: **CPU (smoke)**" in capsys.readouterr().out


def test_without_a_gpu_it_says_so() -> None:
    if gpu.torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(SystemExit, match="no CUDA GPU here"):
        gpu.main([])
