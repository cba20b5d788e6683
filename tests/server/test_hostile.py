"""Hostile numbers at every door: ingest closes 1007 naming the field, import answers 400
naming the line, REST queries 422; nothing is stored and what was stored still reads."""

from __future__ import annotations

import json

import pytest
import synth
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from gradwatch.frames import Hello

NDJSON = {"content-type": "application/x-ndjson"}
BIG = str(2**64)
HOSTILE = [  # (record index in the stream, field, JSON value)
    (0, "started", '"Infinity"'), (0, "t", "NaN"), (0, "world_size", BIG),
    (1, "shapes", f"[[{BIG}]]"), (2, "t", '"NaN"'), (2, "t", "-1e999"), (2, "seq", BIG),
    (2, "step", str(2**53)), (2, "stale", str(2**80)), (2, "late_params", f"[{BIG}]"),
    (-1, "exit_code", str(-(2**64))), (-1, "steps", BIG),
]


def spoiled(index: int, field: str, value: str) -> list[str]:
    """The JSON lines of a 3-step stream with one field set to ``value``."""
    lines = [json.loads(r.model_dump_json()) for r in synth.records(steps=3)]
    lines[index][field] = "@@"
    return [json.dumps(x).replace('"@@"', value) for x in lines]


def stored(client: TestClient) -> object:
    return client.get("/api/runs").json(), client.get("/api/runs/run1/steps").status_code


@pytest.mark.parametrize(("index", "field", "value"), HOSTILE)
def test_hostile_numbers_are_refused_by_name_and_never_stored(
        client: TestClient, index: int, field: str, value: str) -> None:
    lines = spoiled(index, field, value)
    frame = '{"type":"batch","v":1,"run":"run1","rank":0,"records":[' + ",".join(lines) + "]}"
    with client.websocket_connect("/ws/ingest") as ws:
        ws.send_text(frame)
        with pytest.raises(WebSocketDisconnect) as e:
            ws.receive_json()
    assert e.value.code == 1007 and f"field '{field}" in e.value.reason, e.value.reason
    r = client.post("/api/runs/import", content="\n".join(lines) + "\n", headers=NDJSON)
    line = index + 1 if index >= 0 else len(lines)
    assert r.status_code == 400 and r.json()["detail"].startswith(f"upload:{line}: ")
    assert f"field '{field}" in r.json()["detail"]
    assert stored(client) == ({"runs": []}, 404)


def test_hostile_frame_fields_and_queries_get_clear_answers(client: TestClient) -> None:
    client.post("/api/runs/import", content=synth.log_text(synth.records(steps=5)),
                headers=NDJSON)
    before = client.get("/api/runs/run1/steps").json()
    for frame in (Hello(run="run1").model_dump_json().replace('"rank":0', f'"rank":{BIG}'),
                  synth.batches(synth.records("r2", 1))[0].replace('"rank":0', f'"rank":{BIG}',
                                                                   1)):
        with client.websocket_connect("/ws/ingest") as ws:
            ws.send_text(frame)
            with pytest.raises(WebSocketDisconnect) as e:
                ws.receive_json()
        assert e.value.code == 1007 and "rank" in e.value.reason
    for q in (f"steps?start={BIG}", f"steps?end=-{BIG}", f"steps?rank={BIG}",
              f"params?opt=SGD%230&rank={BIG}", f"params?opt=SGD%230&end={BIG}",
              f"export?rank={BIG}"):
        r = client.get(f"/api/runs/run1/{q}")
        assert r.status_code == 422, q
    assert client.get("/api/runs/run1/steps").json() == before


@pytest.mark.parametrize(("body", "words"), [
    ('{"notes": 1e999}', "body field 'notes'"),  # was a 500: the answer echoed inf as JSON
    ('{"name": 5}', "body field 'name'"),
    ('{"name": "x"', "not valid JSON"),
    ("[]", "the request body"),
])
def test_a_bad_request_body_gets_a_422_sentence_naming_the_field(
        client: TestClient, body: str, words: str) -> None:
    client.post("/api/runs/import", content=synth.log_text(synth.records(steps=5)),
                headers=NDJSON)
    before = client.get("/api/runs/run1/steps").json()
    r = client.patch("/api/runs/run1", content=body,
                     headers={"content-type": "application/json"})
    assert r.status_code == 422 and isinstance(r.json()["detail"], str), r.text
    assert words in r.json()["detail"]
    assert client.get("/api/runs/run1/steps").json() == before
    assert client.get("/api/runs/run1").json()["name"] == "run1"


def test_a_query_422_is_a_sentence_too(client: TestClient) -> None:
    r = client.get("/api/runs/run1/steps?start=abc")
    assert r.status_code == 422 and "query parameter 'start'" in r.json()["detail"], r.text


def test_the_export_of_a_rank_the_run_lacks_is_404_not_an_empty_log(
        client: TestClient) -> None:
    client.post("/api/runs/import", content=synth.log_text(synth.records(steps=5)),
                headers=NDJSON)
    r = client.get("/api/runs/run1/export?rank=3")
    assert r.status_code == 404 and "no rank 3" in r.json()["detail"], r.text
    assert client.get("/api/runs/run1/export?rank=0").text.count("\n") > 5


@pytest.mark.parametrize("query", ["max_points=abc", "norms=zz"])
def test_a_live_socket_with_a_query_it_cannot_read_is_closed_naming_the_parameter(
        client: TestClient, query: str) -> None:
    client.post("/api/runs/import", content=synth.log_text(synth.records(steps=5)),
                headers=NDJSON)
    with client.websocket_connect(f"/ws/live?run=run1&{query}") as ws, \
            pytest.raises(WebSocketDisconnect) as e:  # was a bare 403 at the handshake
        ws.receive_json()
    assert e.value.code == 1007 and query.split("=")[0] in e.value.reason, e.value.reason
