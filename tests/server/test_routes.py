"""Routes through TestClient(create_app(...)): ingest, live, REST, import/export, errors."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import synth
from apps import app_settings
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from gradwatch.frames import Hello
from gradwatch.server import create_app
from gradwatch.server.errors import StoreBusy
from gradwatch.steplog import read_log
from gradwatch.verdict import verdict_of
from gradwatch.wire import IngestBatch

NDJSON = {"content-type": "application/x-ndjson"}


def ingest(client: TestClient, recs: list, run: str = "run1", rank: int = 0,
           size: int = 20) -> list[dict]:
    acks = []
    with client.websocket_connect("/ws/ingest") as ws:
        for frame in synth.batches(recs, run, rank, size):
            ws.send_text(frame)
            acks.append(ws.receive_json())
    return acks


def test_ingest_acks_and_stores_every_step_once(client: TestClient) -> None:
    recs = synth.records(steps=100, stale_from=70)
    acks = ingest(client, recs)
    assert acks[-1] == {"type": "ack", "run": "run1", "rank": 0, "seq": len(recs) - 1}
    ingest(client, recs[40:], size=7)  # a resend after a reconnect changes nothing
    run = client.get("/api/runs/run1").json()
    assert run["steps"] == 100 and run["status"] == "finished"
    assert run["optimizers"][0]["params"] == ["w0", "w1", "w2"]
    steps = client.get("/api/runs/run1/steps").json()
    assert steps["step"] == list(range(100)) and steps["total"] == 100
    assert not steps["downsampled"]
    assert steps["resets"][0] == [{"how": "optimizer_zero_grad", "n": 3}]


def test_findings_match_the_judge_of_gradwatch_check(client: TestClient) -> None:
    recs = synth.records(steps=60, stale_from=30)
    ingest(client, recs)
    got = client.get("/api/runs/run1/findings").json()["findings"]
    want = [f.model_dump(mode="json") for f in verdict_of(recs).findings()]
    assert got == want and got[0]["kind"] == "missed_reset" and got[0]["first_step"] == 30


def test_hello_gets_resume_with_highest_stored_seq(client: TestClient) -> None:
    recs = synth.records(steps=30, end=False)
    ingest(client, recs[:10])
    with client.websocket_connect("/ws/ingest") as ws:
        ws.send_text(Hello(run="run1").model_dump_json())
        assert ws.receive_json() == {"type": "resume", "run": "run1", "rank": 0, "seq": 9}
        ws.send_text(Hello(run="nope", rank=3).model_dump_json())
        assert ws.receive_json()["seq"] == -1


@pytest.mark.parametrize(("frame", "code"), [
    (b"\x00binary", 1003),
    ("not json", 1003),
    ('{"type":"batch","v":1,"run":"run1","rank":0,"records":[{"type":"step"}]}', 1007),
    ('{"type":"batch","v":99,"run":"run1","rank":0,"records":[]}', 1007),
    ('{"type":"nope"}', 1007),
])
def test_bad_frames_close_with_a_code_and_change_nothing(client: TestClient, frame: object,
                                                         code: int) -> None:
    ingest(client, synth.records(steps=20))
    before = client.get("/api/runs/run1/steps").json()
    with client.websocket_connect("/ws/ingest") as ws:
        if isinstance(frame, bytes):
            ws.send_bytes(frame)
        else:
            ws.send_text(frame)  # type: ignore[arg-type]
        with pytest.raises(WebSocketDisconnect) as e:
            ws.receive_json()
    assert e.value.code == code and e.value.reason
    assert client.get("/api/runs/run1/steps").json() == before


def test_stream_must_start_with_its_header(client: TestClient) -> None:
    recs = synth.records(steps=5)
    with client.websocket_connect("/ws/ingest") as ws:
        ws.send_text(IngestBatch(run="run1", records=recs[1:]).model_dump_json())
        with pytest.raises(WebSocketDisconnect) as e:
            ws.receive_json()
    assert e.value.code == 1007 and "header" in e.value.reason
    assert client.get("/api/runs").json() == {"runs": []}


def closed_with(ws: object) -> WebSocketDisconnect:
    """The close a websocket test session gets at its next read."""
    with pytest.raises(WebSocketDisconnect) as e:
        ws.receive_json()  # type: ignore[attr-defined]
    return e.value


def test_frame_size_and_run_limits(tmp_path: Path) -> None:
    s = app_settings(data_dir=tmp_path, max_frame_bytes=5000, max_runs=1)
    with TestClient(create_app(s)) as client:
        with client.websocket_connect("/ws/ingest") as ws:
            ws.send_text(" " * 5001)
            e = closed_with(ws)
        assert e.code == 1009 and "5000 bytes" in e.reason
        ingest(client, synth.records(steps=3), size=100)
        with client.websocket_connect("/ws/ingest") as ws:
            ws.send_text(synth.batches(synth.records("run2", 3), "run2", size=100)[0])
            e = closed_with(ws)
        assert e.code == 1008 and "run limit" in e.reason


def test_the_rate_limit_is_per_address_not_per_connection(tmp_path: Path) -> None:
    with TestClient(create_app(app_settings(data_dir=tmp_path, max_msgs_per_sec=2))) as client:
        with client.websocket_connect("/ws/ingest") as ws:
            for i in range(5):  # a burst of twice the rate, then one too many
                ws.send_text(Hello(run=f"r{i}").model_dump_json())
            for _ in range(4):
                assert ws.receive_json()["type"] == "resume"
            e = closed_with(ws)
        assert e.code == 1013 and "rate limit" in e.reason
        # A new connection from the same address does not get a fresh budget.
        with client.websocket_connect("/ws/ingest") as ws:
            ws.send_text(Hello(run="r9").model_dump_json())
            assert closed_with(ws).code == 1013
        time.sleep(0.6)  # the budget refills at 2 frames/s
        with client.websocket_connect("/ws/ingest") as ws:
            ws.send_text(Hello(run="r9").model_dump_json())
            assert ws.receive_json()["type"] == "resume"


def test_ingest_connections_are_capped_and_idle_ones_closed(tmp_path: Path) -> None:
    s = app_settings(data_dir=tmp_path, max_ingest_connections=4, ingest_idle_timeout=0.5)
    with TestClient(create_app(s)) as client:
        with client.websocket_connect("/ws/ingest") as a, \
                client.websocket_connect("/ws/ingest") as b, \
                client.websocket_connect("/ws/ingest") as c:
            sent = time.monotonic()  # a's idle clock starts after this
            for ws in (a, b, c):
                ws.send_text(Hello(run="x").model_dump_json())
                ws.receive_json()
            with client.websocket_connect("/ws/ingest") as d:  # the one kept for owned
                d.send_text(Hello(run="x").model_dump_json())  # streams: x is no such
                e = closed_with(d)
            assert e.code == 1013 and "too many ingest connections" in e.reason
            e = closed_with(a)  # a sends nothing more: closed once idle
            assert e.code == 1001 and "idle" in e.reason
            assert time.monotonic() - sent >= 0.5  # not before its idle timeout
        with client.websocket_connect("/ws/ingest") as ws:  # the slots are free again
            ws.send_text(Hello(run="x").model_dump_json())
            assert ws.receive_json()["type"] == "resume"


def test_live_run_list_and_run_stream(client: TestClient) -> None:
    recs = synth.records(steps=40, stale_from=20)
    with client.websocket_connect("/ws/live") as runs_ws:
        assert runs_ws.receive_json() == {"type": "runs", "runs": []}
        ingest(client, recs[:12], size=12)
        first = runs_ws.receive_json()
        assert first["type"] == "run" and first["run"]["id"] == "run1"
    with client.websocket_connect("/ws/live?run=run1&max_points=100") as ws:
        snap = ws.receive_json()
        assert snap["type"] == "snapshot" and snap["steps"]["step"] == list(range(10))
        assert snap["optimizers"][0]["opt"] == "SGD#0" and snap["findings"] == []
        ingest(client, recs[12:], size=10)
        got_steps, findings = [], None
        while len(got_steps) < 30 or findings is None:
            m = ws.receive_json()
            if m["type"] == "steps":
                got_steps += m["steps"]["step"]
            elif m["type"] == "findings":
                findings = m["findings"]
        assert got_steps == list(range(10, 40))
        assert findings[0]["kind"] == "missed_reset" and findings[0]["first_step"] == 20


def test_live_unknown_run_is_closed(client: TestClient) -> None:
    with client.websocket_connect("/ws/live?run=nope") as ws, \
            pytest.raises(WebSocketDisconnect) as e:
        ws.receive_json()
    assert e.value.code == 4404


def test_import_export_roundtrip_and_delete(client: TestClient, tmp_path: Path) -> None:
    recs = synth.records(steps=30, stale_from=10)
    text = synth.log_text(recs)
    r = client.post("/api/runs/import", content=text,
                    headers={"content-type": "application/x-ndjson"})
    assert r.status_code == 201 and r.json() == {"run": "run1", "steps": 30, "warnings": []}
    r2 = client.post("/api/runs/import", files={"file": ("x.jsonl", text.encode())},
                     headers={"x-gradwatch": "1"})  # multipart is a form: needs the header
    assert r2.status_code == 201 and r2.json()["run"] == "run1-2"
    exported = client.get("/api/runs/run1/export?format=jsonl")
    assert "attachment" in exported.headers["content-disposition"]
    path = tmp_path / "export.jsonl"
    path.write_text(exported.text)
    log = read_log(path)
    assert [r.model_dump() for r in [log.header, *log.records]] == \
        [r.model_dump() for r in recs]
    csv = client.get("/api/runs/run1/export?format=csv").text.splitlines()
    assert csv[0].startswith("rank,opt,step") and len(csv) == 31
    assert client.delete("/api/runs/run1").status_code == 204
    assert client.get("/api/runs/run1").status_code == 404
    assert client.delete("/api/runs/run1").status_code == 404
    assert [x["id"] for x in client.get("/api/runs").json()["runs"]] == ["run1-2"]


def test_import_of_an_invalid_log_names_the_line_and_stores_nothing(
        client: TestClient) -> None:
    lines = synth.log_text(synth.records(steps=5)).splitlines()
    lines[3] = lines[3].replace('"step":1', '"step":-1')
    r = client.post("/api/runs/import", content="\n".join(lines) + "\n", headers=NDJSON)
    assert r.status_code == 400 and r.json()["detail"].startswith("upload:4: ")
    assert client.get("/api/runs").json() == {"runs": []}


def test_downsampled_steps_keep_spikes_and_findings(client: TestClient) -> None:
    recs = synth.records(steps=3000, stale_from=2990, nan_at=1234)
    recs[1502] = recs[1502].model_copy(update={"norm": 1e6})  # step 1500
    ingest(client, recs, size=1000)
    s = client.get("/api/runs/run1/steps?max_points=120").json()
    assert s["downsampled"] and s["total"] == 3000 and len(s["step"]) <= 120
    assert 1500 in s["step"] and 1234 in s["step"] and 2990 in s["step"]
    assert (s["step"][0], s["step"][-1]) == (0, 2999)
    assert s["norm"][s["step"].index(1234)] == "NaN"
    part = client.get("/api/runs/run1/steps?start=100&end=199").json()
    assert part["step"] == list(range(100, 200))
    p = client.get("/api/runs/run1/params", params={"opt": "SGD#0", "max_points": 50}).json()
    assert len(p["step"]) <= 50 and 1500 in p["step"] and len(p["norm"][0]) == 3


def test_healthz_schema_static_and_openapi(client: TestClient) -> None:
    assert client.get("/healthz").json()["status"] == "ok"
    schema = client.get("/api/schema").json()
    assert {"record", "ingest_batch", "live_frames", "ingest_frames"} <= set(schema)
    assert "SnapshotFrame" in schema["live_frames"]
    paths = client.get("/openapi.json").json()["paths"]
    for p in ("/api/runs", "/api/runs/{run_id}", "/api/runs/{run_id}/steps",
              "/api/runs/{run_id}/findings", "/api/runs/import"):
        assert p in paths
    assert client.get("/static/vendor/plotly.min.js").text.startswith("/**")
    assert client.get("/").headers["content-type"].startswith("text/html")
    assert client.get("/static/../server/app.py").status_code == 404
    assert json.loads(client.get("/api/runs").text) == {"runs": []}


def test_a_stream_dropped_without_end_reads_as_interrupted(client: TestClient) -> None:
    ingest(client, synth.records(steps=10, end=False))
    deadline = time.monotonic() + 5
    while client.get("/api/runs/run1").json()["status"] == "live":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert client.get("/api/runs/run1").json()["status"] == "interrupted"
    recs = synth.records(steps=12)  # the probe comes back and finishes
    ingest(client, recs[10:])
    assert client.get("/api/runs/run1").json()["status"] == "finished"
    assert client.get("/api/runs/run1").json()["steps"] == 12


def test_several_runs_stream_at_once(client: TestClient) -> None:
    a = synth.batches(synth.records("a", steps=50, stale_from=25), "a", size=10)
    b = synth.batches(synth.records("b", steps=70), "b", size=10)
    with client.websocket_connect("/ws/ingest") as wa, \
            client.websocket_connect("/ws/ingest") as wb:
        for i in range(max(len(a), len(b))):
            for ws, frames in ((wa, a), (wb, b)):
                if i < len(frames):
                    ws.send_text(frames[i])
                    assert ws.receive_json()["type"] == "ack"
    runs = {r["id"]: r for r in client.get("/api/runs").json()["runs"]}
    assert runs["a"]["steps"] == 50 and runs["b"]["steps"] == 70
    assert runs["a"]["findings"] == 1 and runs["b"]["findings"] == 0


def test_busy_storage_answers_503_and_a_full_run_list_429(tmp_path: Path) -> None:
    with TestClient(create_app(app_settings(data_dir=tmp_path, max_runs=1))) as client:
        text = synth.log_text(synth.records(steps=3))
        assert client.post("/api/runs/import", content=text, headers=NDJSON).status_code == 201
        r = client.post("/api/runs/import", content=text, headers=NDJSON)
        assert r.status_code == 429 and "run limit" in r.json()["detail"]
        store = client.app.state.runs.store  # type: ignore[attr-defined]

        def busy(*_: object, **__: object) -> None:
            raise StoreBusy("the server's storage is busy; retry later")

        store.submit = busy  # as when its queue is full
        for r in (client.delete("/api/runs/run1"),
                  client.post("/api/runs/import", content=text, headers=NDJSON)):
            assert r.status_code == 503 and "retry later" in r.json()["detail"]
        del store.submit
        assert client.get("/api/runs/run1").status_code == 200  # nothing was lost
