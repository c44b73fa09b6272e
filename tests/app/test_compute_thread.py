"""A served app runs its model work on its compute thread, with the process's torch thread count, and
every other thread it starts on one (``model.runs.compute`` says why)."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from fastapi.testclient import TestClient

from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.model.load.models import LoadedModel
from attnscope.model.runs import tiles
from attnscope.model.runs.jobthread import set_starting_threads
from tests.support.tiny import make_engine


def test_the_forward_runs_on_the_compute_thread_and_a_tile_on_one_torch_thread(
        tiny_models: dict[str, LoadedModel], monkeypatch: pytest.MonkeyPatch) -> None:
    lm = tiny_models["llama"]
    engine = make_engine({"m": lm}, "m")
    main = torch.get_num_threads()
    starting = set_starting_threads(2)
    torch.set_num_threads(2)  # this thread's (and, until the app serves, the starting count)
    forwards: list[tuple[str, int]] = []
    handle = lm.model.register_forward_pre_hook(
        lambda *_: forwards.append((threading.current_thread().name, torch.get_num_threads())))
    drawn: list[tuple[str, int]] = []
    head_tile = tiles.head_tile

    def counted(*args: object, **kwargs: object) -> torch.Tensor:
        drawn.append((threading.current_thread().name, torch.get_num_threads()))
        return head_tile(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr("attnscope.model.runs.tile_store.head_tile", counted)
    try:
        with TestClient(create_app(Settings(models={}, default_model="m"), engine)) as client:
            made = client.post("/api/runs", json={"text": "The cat sat on the mat. The cat sat on the"})
            assert made.status_code == 201
            assert forwards == [("attnscope-compute", 2)]
            run_id = made.json()["run_id"]
            tile = client.get(f"/api/runs/{run_id}/attention", params={"layer": 0, "head": 1, "size": 8, "format": "bin"})
            assert tile.status_code == 200, tile.text
            assert ablation_ok(client, run_id)
            tools = len(forwards)
            assert {name for name, _ in forwards[1:]} == {"attnscope-compute"}  # the tools' forwards too
            streamed = client.post("/api/generate", json={"text": "The cat", "max_new_tokens": 3})
            assert streamed.status_code == 200 and "event: done" in streamed.text
            assert len(forwards) >= tools + 3  # the prefill and the steps
            assert {name for name, _ in forwards[tools:]} == {"attnscope-compute"}  # a generation's steps too
            generated = len(forwards)
            assert survey_done(client)
            assert len(forwards) > generated  # the survey's probe and its windows
            assert {name for name, _ in forwards[generated:]} == {"attnscope-compute"}
        assert drawn and {count for _, count in drawn} == {1}
        assert all(name != "attnscope-compute" for name, _ in drawn)
    finally:
        handle.remove()
        torch.set_num_threads(main)
        set_starting_threads(starting)  # an app serving through the session keeps its starting count
        engine.close()


def ablation_ok(client: TestClient, run_id: str) -> bool:
    return client.post(f"/api/runs/{run_id}/ablate", json={"heads": [[0, 1]]}).status_code == 200


def survey_done(client: TestClient) -> bool:
    started = client.post("/api/surveys", params={"max_tokens": 16},
                          content=b"The cat sat on the mat.\n\nA dog ran in the park. The dog ran.")
    assert started.status_code == 202, started.text
    for _ in range(600):
        status = client.get(f"/api/surveys/{started.json()['id']}").json()["status"]
        if status != "running":
            return bool(status == "done")
        time.sleep(0.05)
    return False
