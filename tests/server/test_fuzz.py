"""Property-based fuzzing of ingest frames: the server stays up, bad frames get a close
code, and nothing already stored changes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import synth
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.websockets import WebSocketDisconnect

from gradwatch.server import Settings, create_app

BASE = json.loads(synth.batches(synth.records(steps=3, end=False), size=100)[0])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)


@st.composite
def mutated(draw: st.DrawFn) -> str | bytes:
    """A valid frame with one thing broken, or garbage."""
    kind = draw(st.sampled_from(["field", "record", "drop", "garbage", "bytes", "type"]))
    frame: Any = json.loads(json.dumps(BASE))
    if kind == "garbage":
        return draw(st.text(max_size=200))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "field":
        frame[draw(st.sampled_from(["v", "run", "rank", "records", "type"]))] = \
            draw(json_values)
    elif kind == "drop":
        rec = draw(st.sampled_from(frame["records"]))
        rec.pop(draw(st.sampled_from(sorted(rec))))
    elif kind == "type":
        frame = draw(json_values)
    else:
        rec = draw(st.sampled_from(frame["records"]))
        rec[draw(st.sampled_from(sorted(rec)))] = draw(json_values)
    return json.dumps(frame)


def snapshot(client: TestClient) -> Any:
    return (client.get("/api/runs/run1/steps").json(),
            client.get("/api/runs/run1/findings").json(),
            client.get("/api/runs/run1").json()["steps"])


def test_fuzzed_frames_never_hurt_the_server(tmp_path: Path) -> None:
    with TestClient(create_app(Settings(data_dir=tmp_path))) as client:
        with client.websocket_connect("/ws/ingest") as ws:
            for f in synth.batches(synth.records(steps=30, stale_from=10), size=50):
                ws.send_text(f)
                ws.receive_json()
        before = [snapshot(client)]
        codes: set[int] = set()

        @settings(max_examples=150, deadline=None,
                  suppress_health_check=[HealthCheck.too_slow])
        @given(mutated())
        def check(frame: str | bytes) -> None:
            with client.websocket_connect("/ws/ingest") as ws:
                if isinstance(frame, bytes):
                    ws.send_bytes(frame)
                else:
                    ws.send_text(frame)
                try:
                    answer = ws.receive_json()
                except WebSocketDisconnect as e:
                    codes.add(e.code)
                    assert e.code in (1003, 1007, 1008, 1009) and e.reason
                    assert len(e.reason.encode()) <= 123
                    assert snapshot(client) == before[0]
                    return
                assert answer["type"] in ("ack", "resume")
                before[0] = snapshot(client)  # a frame that happened to be valid

        check()
        assert client.get("/healthz").json()["status"] == "ok"
        assert {1003, 1007} <= codes
