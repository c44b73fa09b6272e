"""The survey routes: a corpus uploaded, followed to its result; its file downloaded and opened again;
hostile corpora and unknown ids answered clearly."""

from __future__ import annotations

import time

from fastapi.testclient import TestClient

TEXTS = ["The cat sat on the mat. The cat sat on the mat.", "My friend John lives in the city. My friend John lives in"]


def _wait(client: TestClient, survey_id: str) -> dict:
    for _ in range(600):
        body = client.get(f"/api/surveys/{survey_id}").json()
        if body["status"] != "running":
            return body
        time.sleep(0.05)
    raise AssertionError("the survey did not finish")


def test_a_survey_from_upload_to_file(client: TestClient) -> None:
    r = client.post("/api/surveys?top_k=2&name=c.txt", content="\n\n".join(TEXTS).encode())
    assert r.status_code == 202, r.text
    started = r.json()
    assert started["status"] == "running" and started["model"] == "tiny-gpt2"
    done = _wait(client, started["id"])
    assert done["status"] == "done", done
    survey = done["survey"]
    assert survey["documents"] == 2 and survey["source"] == "c.txt" and done["fraction"] == 1.0
    assert len(survey["heads"]) == survey["n_layers"] * survey["n_heads"]
    head = survey["heads"][0]
    assert set(head["entropy"]) == {"mean", "std", "count"} and len(head["examples"]) <= 2
    f = client.get(f"/api/surveys/{started['id']}/file")
    assert f.status_code == 200 and len(f.content) > 100
    opened = client.post("/api/surveys/open", content=f.content)
    assert opened.status_code == 201, opened.text
    again = opened.json()
    assert again["status"] == "done" and again["survey"]["heads"][0]["entropy"] == head["entropy"]


def test_hostile_corpora_and_unknown_ids(client: TestClient) -> None:
    r = client.post("/api/surveys", content=b"\x00\x01\x02binary")
    assert r.status_code == 202
    failed = _wait(client, r.json()["id"])
    assert failed["status"] == "failed" and "looks binary" in failed["error"]
    r = client.post("/api/surveys?name=c.jsonl", content=b'{"text": "a b c d"}\n{"nope": 1}\n')
    failed = _wait(client, r.json()["id"])
    assert failed["status"] == "failed" and "line 2" in failed["error"]
    assert client.get("/api/surveys/nope").status_code == 404
    assert client.get("/api/surveys/nope").json()["code"] == "survey_not_found"
    r = client.post("/api/surveys/open", content=b"not a survey file at all")
    assert r.status_code == 422 and "not a usable attnscope survey file" in r.json()["message"]
    r = client.post("/api/surveys?top_k=0", content=b"text")
    assert r.status_code == 422


def test_a_name_is_shown_never_used_as_a_path(client: TestClient) -> None:
    r = client.post("/api/surveys?name=../../etc/passwd.jsonl", content=b'{"text": "the cat sat on the mat"}\n')
    assert r.status_code == 202, r.text
    done = _wait(client, r.json()["id"])
    assert done["status"] == "done", done
    assert done["survey"]["source"] == "../../etc/passwd.jsonl"  # the name, as given: shown, not followed
