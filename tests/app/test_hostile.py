"""A corpus of malformed and hostile requests: each gets a clear 4xx, never a 5xx,
and the server keeps answering."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from fastapi.testclient import TestClient

from attnscope.app.main import create_app
from attnscope.app.settings import Settings
from attnscope.model.services.engine import Engine

JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def raw(engine: Engine) -> TestClient:
    """A client that shows a server error as a 500 instead of raising it."""
    app = create_app(Settings(models={}, default_model="tiny-gpt2", max_body_bytes=64 * 1024), engine)
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


@pytest.fixture(scope="module")
def run_id(raw: TestClient) -> str:
    made = raw.post("/api/runs", json={"text": "a small prompt for hostile tests"})
    assert made.status_code == 201, made.text
    return str(made.json()["run_id"])


def _raw_bodies() -> list[tuple[bytes, dict[str, str]]]:
    bodies = [b"", b"null", b"[]", b"{}", b'"text"', b"123", b"{", b"{'text': 'x'}", b'{"text": "a",}',
              b'{"text": NaN}', b'{"text": Infinity}', b"\xff\xfe\x00", b'{"text": "a"}{"text": "b"}',
              b'{"text": "\\ud800"}', b'{"text": "a", "top_k": NaN}', b'{"text": "a", "top_k": 1e400}']
    cases = [(b, JSON) for b in bodies]
    cases += [(b'{"text": "hi"}', {"content-type": "text/plain"}), (b"text=hi", {"content-type": "application/x-www-form-urlencoded"}),
              (b'{"text": "hi"}', {"content-type": "application/xml"}), (b'{"text": "hi"}', {})]
    return cases


RUN_BODIES: list[Any] = [
    {"text": v} for v in (5, 5.5, True, None, [], {}, ["a"], {"a": 1}, "", " ", "\n", "\t\r\n", "\u3000\u2003", "word " * 2000)
] + [
    {"text": "hi", "top_k": v} for v in (0, -1, 101, 10**20, "5x", 1.5, [], "")  # null = the default
] + [
    {"text": "hi", "model": v} for v in ("", "../../etc", "/etc/passwd", "gpt2", "openai-community/gpt2", 5, "tiny-gpt2\x00", "x" * 5000)
] + [
    {"text": "hi", "extra": 1}, {"txt": "hi"}, {"text": "hi", "text2": "x"}, {"text": "hi", "top_k": 3, "model": "tiny-gpt2", "x": []},
]

GENERATE_BODIES: list[Any] = [
    {"text": "hi", "max_new_tokens": v} for v in (0, -1, 10**6, "many", 2.5)
] + [
    {"text": "hi", "temperature": v} for v in (-1, 11, "hot", None)
] + [
    {"text": "hi", "top_p": v} for v in (0, 1.5, -0.1)
] + [
    {"text": "hi", "seed": v} for v in (-1, 2**70, "abc")
] + [
    {"text": "hi", "top_k": -5}, {}, {"text": ""}, {"text": "  "}, {"text": "hi", "model": "/tmp"}, {"text": "word " * 2000},
]


# bad bodies for the other POST endpoints; {run} is the run id
POST_BODIES: dict[str, list[Any]] = {
    "/api/timing": [{}, {"text": ""}, {"text": 5}, {"text": "hi", "model": "nope"}, {"text": "word " * 200},
                    {"text": "hi", "model": "minilm-l6"}, {"text": "hi", "extra": 1}],
    "/api/runs/{run}/ablate": [{}, {"heads": [[99, 0]]}, {"heads": [[0, -1]]}, {"heads": [[0]]}, {"heads": "all"},
                               {"heads": [[0, 0]], "mode": "half"}, {"heads": [[0, 0]], "top_k": 0}],
    "/api/runs/nope/ablate": [{"heads": [[0, 0]]}],
    "/api/models/nope/load": [{}, None],  # neither loaded nor offered: 404
    "/api/runs/{run}/ablate/scan": [{}, {"position": -1}, {"position": 9999}, {"position": 0, "token": -5},
                                    {"position": 0, "token": 10**6}, {"position": 0, "mode": "x"}],
    "/api/patch": [{}, {"clean": "a b", "corrupted": "a", "answer": " x", "wrong": " y"},
                   {"clean": "a", "corrupted": "b", "answer": " x", "wrong": " x"},
                   {"clean": "a", "corrupted": "b", "answer": " two words here", "wrong": " y"},
                   {"clean": "", "corrupted": "", "answer": "", "wrong": ""},
                   {"clean": "a", "corrupted": "b", "answer": " x", "wrong": " y", "model": "minilm-l6"}],
}


def _query_cases(run: str) -> list[str]:
    att = f"/api/runs/{run}/attention"
    cases = [f"{att}?layer={v}" for v in ("-1", "99", str(2**40), "abc", "1.5", "", "NaN", "inf", "-0x1")]
    cases += [f"{att}?layer=0&head={v}" for v in ("-1", "4", "999999999999", "h", "1e3")]
    cases += [f"{att}?layer=0&head=0&format={v}" for v in ("xml", "BIN", "", "json;drop")]
    cases += [f"{att}?layer=0&format=bin&size={v}" for v in ("1", "10000", "-4", "big")]
    cases += [f"{att}?layer=0&head=0&{k}={v}" for k in ("q0", "q1", "k0", "k1")
              for v in ("-1", "99999", "x", "1.5", str(2**40))]
    cases += [f"{att}?layer=0&head=0&q0=3&q1=3", f"{att}?layer=0&head=0&k0=4&k1=2", f"{att}?layer=0&pool=median",
              f"{att}?layer=0&head=0&pool=MAX", f"{att}?layer=0&head=0&size=0&format=f32"]
    cases += [f"{att}", f"{att}?head=0"]
    cases += [f"/api/runs/{v}/attention?layer=0" for v in ("..%2F..%2Fetc", "%00", "x" * 4000, "%3Cscript%3E", "nope")]
    cases += [f"/api/runs/{run}/next?position={v}" for v in ("-1", "10000", "x", "")]
    cases += [f"/api/runs/{run}/next?position=0&temperature={v}" for v in ("0", "-1", "nan", "inf", "1e309", "101")]
    cases += [f"/api/runs/{run}/logit-lens?top_k={v}" for v in ("0", "51", "-5", "many")]
    cases += [f"/api/runs/{run}/contributions?layer=0&head=0&position={v}" for v in ("-1", "99", "p")]
    cases += [f"/api/runs/{run}/contribution-gaps?position={v}" for v in ("-1", "99", "p", "")]
    cases += [f"/api/runs/{run}/attribution?position={v}" for v in ("-1", "99", "x", "")]
    cases += [f"/api/runs/{run}/attribution?position=0&{k}={v}" for k in ("token", "token_b") for v in ("-1", "20480", str(10**7))]
    cases += ["/api/runs/nope/export", "/api/runs/nope/attribution?position=0"]
    qk = f"/api/runs/{run}/qk-attribution"
    cases += [f"{qk}?layer={v}&head=0&query=1" for v in ("-1", "99", "x", "")]
    cases += [f"{qk}?layer=0&head={v}&query=1" for v in ("-1", "99", "h")]
    cases += [f"{qk}?layer=0&head=0&query={v}" for v in ("-1", "99", str(2**40), "q")]
    cases += [f"{qk}?layer=0&head=0&query=1&key={v}" for v in ("-1", "5", "99", "k")] + [f"{qk}?layer=0&head=0"]
    cases += ["/api/runs/nope/qk-attribution?layer=0&head=0&query=0"]
    cases += ["/api/surveys/nope", "/api/surveys/nope/file", "/api/surveys/%2e%2e%2fx", "/api/surveys/" + "x" * 4000]
    cases += [f"/api/runs/{run}/export?format={v}" for v in ("xml", "npz", "", "SAFETENSORS")]
    cases += [f"/api/models/tiny-gpt2/embedding?id={v}" for v in ("-1", "20480", str(2**40), "x", "")]
    cases += ["/api/models/%2Fetc%2Fpasswd/embedding?id=1", "/api/models/nope/anatomy", "/api/models/nope/positions",
              "/api/models/tiny-gpt2/positions?count=0", "/api/models/tiny-gpt2/positions?count=5000",
              "/api/compare?a=nope&b=nope", "/api/compare?a=x", "/api/runs/nope", "/api/runs/nope/residual",
              "/api/runs/nope/sparsity", "/api/runs/nope/heads", "/api/nothing-here", "/api/models/nope/patch-example",
              "/api/models/%2Fetc%2Fpasswd/load"]
    cases += [f"/api/runs/{run}/heads?wait={v}" for v in ("-1", "61", "1e400", "nan", "x", "")]
    cases += [f"/api/runs/{run}/stored?wait={v}" for v in ("-1", "11", "1e400", "nan", "x", "")] + ["/api/runs/nope/stored"]
    return cases


TRAVERSAL = ["/static/../pyproject.toml", "/static/%2e%2e/pyproject.toml", "/static/..%2fpyproject.toml",
             "/static/%2e%2e%2fpyproject.toml", "/static/%252e%252e/pyproject.toml", "/static/....//pyproject.toml",
             "/static/js/../../pyproject.toml", "/static/%2e%2e%5cpyproject.toml", "/vendor/swagger/..%2f..%2fsetup.py",
             "/vendor/swagger/%2e%2e%2f__init__.py", "/static//etc/passwd", "/static/%00.css"]


def _check(r: Any, what: str) -> None:
    assert 400 <= r.status_code < 500, f"{what}: {r.status_code} {r.text[:200]}"
    if r.headers.get("content-type", "").startswith("application/json"):
        body = r.json()
        assert body.get("message") or body.get("detail"), what


def _sent(run: str) -> set[tuple[str, str]]:
    """(method, path) of every request the corpus sends."""
    sent = {("POST", "/api/runs"), ("POST", "/api/generate"), ("POST", "/api/timing"), ("PUT", "/api/runs"),
            ("DELETE", "/api/runs/x"), ("POST", "/api/runs/import"), ("POST", "/api/surveys"),
            ("POST", "/api/surveys/open"), ("POST", "/api/surveys/nope/stop")}
    sent |= {("GET", url.split("?")[0]) for url in _query_cases(run)}
    sent |= {("POST", path.format(run=run)) for path in POST_BODIES}
    return sent


def test_corpus_reaches_every_route_that_takes_input(raw: TestClient, run_id: str) -> None:
    """A new endpoint with parameters or a body fails this until hostile cases reach it."""
    sent = _sent(run_id)
    operations = [(method.upper(), path, op) for path, ops in raw.app.openapi()["paths"].items()
                  for method, op in ops.items()]
    missed = []
    for method, path, op in operations:
        if not (op.get("parameters") or op.get("requestBody")):
            continue  # nothing to send it
        pattern = re.compile(re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(path)))
        if not any(m == method and pattern.fullmatch(p) for m, p in sent):
            missed.append(f"{method} {path}")
    assert missed == [], f"no hostile case reaches {missed}"
    assert len(operations) >= 20


@pytest.mark.parametrize(("path", "i"), [(p, i) for p, bodies in POST_BODIES.items() for i in range(len(bodies))])
def test_bad_bodies_of_other_endpoints(raw: TestClient, run_id: str, path: str, i: int) -> None:
    body = POST_BODIES[path][i]
    _check(raw.post(path.format(run=run_id), json=body), f"{path} {json.dumps(body)[:80]}")


@pytest.mark.parametrize("i", range(len(_raw_bodies())))
def test_raw_bodies_as_run_files(raw: TestClient, i: int) -> None:
    """Every raw body as a run file to import: refused (422 bad_run_file, 413), never stored, never a 5xx."""
    body, _headers = _raw_bodies()[i]
    before = len(raw.app.state.engine.store)
    r = raw.post("/api/runs/import", content=body, headers={"content-type": "application/octet-stream"})
    _check(r, f"import {body[:40]!r}")
    assert len(raw.app.state.engine.store) == before


@pytest.mark.parametrize("i", range(len(_raw_bodies())))
def test_raw_bodies_as_survey_files(raw: TestClient, i: int) -> None:
    """Every raw body as a survey file to open: refused with a message, never a 5xx."""
    body, _headers = _raw_bodies()[i]
    _check(raw.post("/api/surveys/open", content=body, headers={"content-type": "application/octet-stream"}),
           f"open survey {body[:40]!r}")


def test_survey_starts_refuse_bad_parameters(raw: TestClient) -> None:
    for query in ("top_k=0", "top_k=51", "top_k=x", "max_tokens=1", "max_tokens=" + str(2**40), "model=nope",
                  "name=" + "n" * 300):
        _check(raw.post(f"/api/surveys?{query}", content=b"the cat sat on the mat"), query)
    _check(raw.post("/api/surveys/nope/stop"), "stop an unknown survey")


@pytest.mark.parametrize("i", range(len(_raw_bodies())))
def test_raw_bodies(raw: TestClient, i: int) -> None:
    body, headers = _raw_bodies()[i]
    _check(raw.post("/api/runs", content=body, headers=headers), repr(body))


@pytest.mark.parametrize("body", RUN_BODIES, ids=lambda b: json.dumps(b)[:40])
def test_bad_run_bodies(raw: TestClient, body: Any) -> None:
    _check(raw.post("/api/runs", json=body), json.dumps(body)[:80])


@pytest.mark.parametrize("body", GENERATE_BODIES, ids=lambda b: json.dumps(b)[:40])
def test_bad_generate_bodies(raw: TestClient, body: Any) -> None:
    _check(raw.post("/api/generate", json=body), json.dumps(body)[:80])


def test_bad_queries(raw: TestClient, run_id: str) -> None:
    for url in _query_cases(run_id):
        _check(raw.get(url), url)


def test_big_bodies_and_methods(raw: TestClient) -> None:
    big = json.dumps({"text": "a" * (10 * 1024 * 1024)}).encode()
    _check(raw.post("/api/runs", content=big, headers=JSON), "10 MB body")
    _check(raw.post("/api/timing", content=big, headers=JSON), "10 MB body")
    _check(raw.put("/api/runs", json={"text": "hi"}), "PUT")
    _check(raw.delete("/api/runs/x"), "DELETE")


def test_static_files_cannot_escape(raw: TestClient) -> None:
    for url in TRAVERSAL:
        r = raw.get(url)
        assert r.status_code in (400, 404), f"{url}: {r.status_code}"
        assert "[build-system]" not in r.text and "root:" not in r.text


@pytest.mark.parametrize("text", ["emoji 🐶🧠", "مرحبا", "zero\u200bwidth", "\u202eRTL override", "ctl\x00\x01\x7f",
                                  "\"><svg onload=alert(1)>", "'; DROP TABLE runs; --", "\ufeffBOM", "a\u0301\u0301\u0301",
                                  "𝕌𝕟𝕚𝕔𝕠𝕕𝕖"])
def test_odd_but_valid_text_is_accepted(raw: TestClient, text: str) -> None:
    r = raw.post("/api/runs", json={"text": text})
    assert r.status_code == 201
    tokens = r.json()["tokens"]
    for t in tokens:
        if not t["partial"]:  # a partial token shows its bytes (‹f0 9f›), the character goes to its last byte
            assert text[t["start"]:t["end"]] == t["text"]
    assert "".join(text[t["start"]:t["end"]] for t in tokens) == text


def test_server_still_answers(raw: TestClient) -> None:
    assert raw.get("/api/models").status_code == 200
    assert raw.post("/api/runs", json={"text": "still here"}).status_code == 201


@pytest.mark.parametrize("over", [1, 1000, 100_000, 5 << 20])
def test_413_figures_differ_when_rounding_would_make_them_equal(over: int) -> None:
    """"would keep 32 MiB ... holds at most 32 MiB" contradicted itself: the two figures of every
    refusal by size differ (more decimals, or bytes), and the first is the larger."""
    from types import SimpleNamespace

    from attnscope.model.errors import TooLarge
    from attnscope.model.runs import budget
    from attnscope.model.runs.record import RunStore

    cap = 32 * budget.MIB
    messages = []
    with pytest.raises(TooLarge) as refused:
        budget.admit(budget.Estimate(n=100, keep=cap + over, peak=2 * cap), cap)
    messages.append((str(refused.value), r"would keep (\S+ \S+) .* holds at most (\S+ \S+)"))
    with pytest.raises(TooLarge) as refused, budget.MemoryBudget(cap).reserve(cap + over):
        pass
    messages.append((str(refused.value), r"would need (\S+ \S+) .* at most (\S+ \S+)"))
    with pytest.raises(TooLarge) as refused:
        RunStore(cap).add(SimpleNamespace(nbytes=cap + over))
    messages.append((str(refused.value), r"keeps (\S+ \S+); .* holds at most (\S+ \S+)"))
    for message, pattern in messages:
        big, limit = re.search(pattern, message).groups()
        assert big != limit, message
        unit = big.split()[1]
        assert unit == limit.split()[1] and unit in ("MiB", "bytes"), message
        assert float(big.split()[0].replace(",", "")) > float(limit.split()[0].replace(",", "")), message


STRICT_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("/api/runs", {"text": "hi", "top_k": True}, "top_k: must be an integer, not true"),
    ("/api/runs", {"text": "hi", "top_k": "5"}, 'top_k: must be an integer (without quotes), not the string "5"'),
    ("/api/runs/{run}/ablate", {"heads": [[True, False]]}, "heads[0][0]: must be an integer, not true"),
    ("/api/runs/{run}/ablate", {"heads": [[1, "0"]]}, 'heads[0][1]: must be an integer (without quotes), not the string "0"'),
    ("/api/runs/{run}/ablate", {"heads": [[0, 0]], "top_k": False}, "top_k: must be an integer, not false"),
    ("/api/runs/{run}/ablate/scan", {"position": True}, "position: must be an integer, not true"),
    ("/api/runs/{run}/ablate/scan", {"position": "1"}, 'position: must be an integer (without quotes), not the string "1"'),
    ("/api/runs/{run}/ablate/scan", {"position": 0, "token": False}, "token: must be an integer, not false"),
    ("/api/patch", {"clean": "a b", "corrupted": "a c", "answer": " x", "wrong": " y", "position": True},
     "position: must be an integer, not true"),
    ("/api/timing", {"text": "hi", "repeats": True}, "repeats: must be an integer, not true"),
    ("/api/timing", {"text": "hi", "repeat_to": "3"}, 'repeat_to: must be an integer (without quotes), not the string "3"'),
    ("/api/generate", {"text": "hi", "max_new_tokens": True}, "max_new_tokens: must be an integer, not true"),
    ("/api/generate", {"text": "hi", "seed": "7"}, 'seed: must be an integer (without quotes), not the string "7"'),
    ("/api/generate", {"text": "hi", "record": True, "watch_layer": False}, "watch_layer: must be an integer, not false"),
    ("/api/generate", {"text": "hi", "temperature": True}, "temperature: must be a number, not true"),
    ("/api/generate", {"text": "hi", "top_p": "0.5"}, 'top_p: must be a number (without quotes), not the string "0.5"'),
    ("/api/generate", {"text": "hi", "record": 1}, "record: Input should be a valid boolean"),
    ("/api/generate", {"text": "hi", "stop_at_eos": "false"}, 'stop_at_eos: must be true or false, not the string "false"'),
    ("/api/runs", {"text": "hi", "truncate": "yes"}, 'truncate: must be true or false, not the string "yes"'),
]


@pytest.mark.parametrize(("path", "body", "message"), STRICT_CASES, ids=lambda c: json.dumps(c)[:50])
def test_numbers_in_bodies_are_strict(raw: TestClient, run_id: str, path: str, body: dict[str, Any], message: str) -> None:
    """true/false and numeric strings are not integers ({"heads": [[true, false]]} once ablated head [1, 0])."""
    r = raw.post(path.format(run=run_id), json=body)
    assert r.status_code == 422, r.text
    assert message in r.json()["message"], r.json()["message"]


def test_real_numbers_still_pass(raw: TestClient, run_id: str) -> None:
    assert raw.post(f"/api/runs/{run_id}/ablate", json={"heads": [[1, 0]], "top_k": 3}).status_code == 200
    assert raw.post(f"/api/runs/{run_id}/ablate/scan", json={"position": 1}).status_code == 200
    assert raw.post("/api/runs", json={"text": "hi", "top_k": 3}).status_code == 201
    assert raw.post("/api/timing", json={"text": "hi", "repeats": 1}).status_code == 200
    r = raw.post("/api/generate", json={"text": "hi", "max_new_tokens": 2, "temperature": 1, "top_p": 1})
    assert r.status_code == 200  # an integer is a number: temperature 1 reads as 1.0


def test_a_chunked_body_over_the_limit_gets_the_same_413(raw: TestClient) -> None:
    """No Content-Length (chunked): once the body streams past the limit, the same 413 as a sized body
    (it was 400 "There was an error parsing the body")."""
    limit = 64 * 1024
    payload = json.dumps({"text": "a" * (2 * limit)}).encode()

    def chunks() -> Any:
        for i in range(0, len(payload), 8192):
            yield payload[i:i + 8192]

    sized = raw.post("/api/runs", content=payload, headers=JSON)
    chunked = raw.post("/api/runs", content=chunks(), headers=JSON)
    assert "content-length" not in chunked.request.headers
    assert sized.status_code == chunked.status_code == 413
    assert chunked.json() == sized.json()
    assert chunked.json()["message"] == "request body is larger than the limit of 65,536 bytes (ATTNSCOPE_MAX_BODY_BYTES)"
    small = raw.post("/api/runs", content=iter([b'{"text": ', b'"chunked but small"}']), headers=JSON)
    assert small.status_code == 201


def test_a_body_that_is_not_utf8_says_so(raw: TestClient) -> None:
    r = raw.post("/api/runs", content=b'{"text": "caf\xe9 au lait"}', headers=JSON)
    assert r.status_code == 400
    assert r.json()["message"] == ("the request body is not valid UTF-8 (byte 0xe9 at offset 13): send JSON encoded "
                                   "as UTF-8")


@pytest.mark.parametrize("charset", ["latin-1", "ISO-8859-1", "windows-1252", "utf-16"])
def test_a_json_body_in_another_charset_is_415(raw: TestClient, charset: str) -> None:
    body = '{"text": "café"}'.encode("latin-1")
    r = raw.post("/api/runs", content=body, headers={"content-type": f"application/json; charset={charset}"})
    assert r.status_code == 415
    assert r.json()["message"].startswith(f"the request body is declared as charset={charset}; send JSON encoded "
                                          "as UTF-8")


@pytest.mark.parametrize("charset", ["utf-8", "UTF-8", '"utf-8"', "utf8"])
def test_a_json_body_declared_utf8_is_read(raw: TestClient, charset: str) -> None:
    r = raw.post("/api/runs", content='{"text": "café"}'.encode(),
                 headers={"content-type": f"application/json; charset={charset}"})
    assert r.status_code == 201, r.text


def test_json_nested_50000_levels_is_a_clear_400(engine: Engine) -> None:
    depth = 50_000
    body = ('{"text": ' + "[" * depth + "]" * depth + "}").encode()
    app = create_app(Settings(models={}, default_model="tiny-gpt2", max_body_bytes=1 << 20), engine)
    with TestClient(app, raise_server_exceptions=False) as c:
        for payload in (body, b'{"heads": ' + b"[" * depth):
            r = c.post("/api/runs", content=payload, headers=JSON)
            assert r.status_code == 400, r.text[:200]
            assert r.json()["message"].startswith("the request body's JSON is nested too deeply to read")
        assert c.post("/api/runs", json={"text": "still answering"}).status_code == 201
