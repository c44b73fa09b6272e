"""Over real sockets: streaming generation stops when the client goes away."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.model.services.engine import Engine
from tests.support.servers import serve


@pytest.fixture(scope="module")
def base_url(engine: Engine) -> Iterator[str]:
    with serve(create_app(Settings(models={}, default_model="tiny-gpt2"), engine)) as url:
        yield url


def test_disconnect_stops_generation(base_url: str, engine: Engine) -> None:
    lm = engine.model("tiny-gpt2")
    calls = []

    def slow_counter(*_args: object, **_kwargs: object) -> None:
        calls.append(time.monotonic())
        time.sleep(0.02)  # make each step slow enough that 200 of them take seconds

    handle = lm.model.register_forward_pre_hook(slow_counter)
    try:
        body = {"text": "The meaning of life is", "max_new_tokens": 200, "temperature": 0}
        seen = 0
        with httpx.stream("POST", f"{base_url}/api/generate", json=body, timeout=30) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("event: token"):
                    seen += 1
                    if seen == 3:
                        break  # leaving the block closes the connection
        time.sleep(1.0)
        at_stop = len(calls)
        time.sleep(1.0)
        assert len(calls) == at_stop, "the model was still being called after the client left"
        assert at_stop < 20, f"{at_stop} forwards for 3 consumed tokens"
    finally:
        handle.remove()


def test_server_keeps_answering_after_garbage(base_url: str) -> None:
    with httpx.Client(base_url=base_url, timeout=30) as c:
        # a UTF-16 byte-order mark is not UTF-8 JSON (400 body_not_utf8, #36); the rest is JSON that does not fit
        for body, status in ((b"\xff\xfe", 400), (b"{", 422), (b"[]", 422), (b'{"text": null}', 422)):
            assert c.post("/api/runs", content=body, headers={"content-type": "application/json"}).status_code == status
        assert c.post("/api/runs", json={"text": "still alive"}).status_code == 201
