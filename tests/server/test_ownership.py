"""One stream, one writer; acks that mean what they say (the real app, through its socket).

A stream opened after a ``hello`` with a key belongs to that key: another connection cannot
add records to it, end it or move its sequence forward (close 4403, nothing stored), while
the owner reconnects, also after a restart. The ack and the resume position are the
contiguous prefix of stored records, never the highest seq seen.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import synth
from fastapi.testclient import TestClient
from starlette.testclient import WebSocketTestSession
from starlette.websockets import WebSocketDisconnect

from gradwatch.frames import Hello
from gradwatch.server import Settings, create_app, db
from gradwatch.wire import End, IngestBatch

KEY = "k" * 32
OTHER = "o" * 32
OWNED = 4403


def batch(recs: list[Any], run: str = "run1") -> str:
    return IngestBatch(run=run, rank=0, records=recs).model_dump_json()


def hello(ws: WebSocketTestSession, key: str | None, run: str = "run1") -> int:
    ws.send_text(Hello(run=run, key=key).model_dump_json(exclude_none=True))
    m = ws.receive_json()
    assert m["type"] == "resume", m
    return int(m["seq"])


def send(ws: WebSocketTestSession, recs: list[Any], run: str = "run1") -> int:
    ws.send_text(batch(recs, run))
    m = ws.receive_json()
    assert m["type"] == "ack", m
    return int(m["seq"])


def refused(client: TestClient, frames: list[str]) -> tuple[int, str]:
    """Send ``frames`` on a new connection; the close code and reason it gets."""
    with client.websocket_connect("/ws/ingest") as ws:
        for f in frames:
            ws.send_text(f)
        with pytest.raises(WebSocketDisconnect) as e:
            while True:
                ws.receive_json()
    return e.value.code, e.value.reason


@pytest.fixture
def recs() -> list[Any]:
    return synth.records(steps=40)


@pytest.fixture
def owned(client: TestClient, recs: list[Any]) -> Iterator[WebSocketTestSession]:
    """The owner's connection, with the first 20 records stored."""
    with client.websocket_connect("/ws/ingest") as ws:
        assert hello(ws, KEY) == -1
        assert send(ws, recs[:20]) == 19
        yield ws


def test_another_connection_cannot_write_end_or_advance_an_owned_stream(
        client: TestClient, owned: WebSocketTestSession, recs: list[Any]) -> None:
    end = End(seq=20, t=1001.0, status="finished")
    far = synth.step(5000, 4999)
    attempts = {
        "end, no hello": [batch([end])],
        "far seq, no hello": [batch([far])],
        "end, keyless hello": [Hello(run="run1").model_dump_json(exclude_none=True),
                               batch([end])],
        "end, wrong key": [Hello(run="run1", key=OTHER).model_dump_json(), batch([end])],
        "header again": [batch(recs[:1])],
    }
    for what, frames in attempts.items():
        code, reason = refused(client, frames)
        assert code == OWNED and "belongs to" in reason, (what, code, reason)
    run = client.get("/api/runs/run1").json()
    assert run["status"] == "live" and run["steps"] == 18
    assert client.get("/api/runs/run1/steps?max_points=100000").json()["step"] == \
        list(range(18))
    # the owner goes on as if nothing happened: the next ack is its own
    assert send(owned, recs[20:]) == len(recs) - 1
    assert client.get("/api/runs/run1").json()["status"] == "finished"


def test_the_owner_reconnects_and_resumes_also_after_a_restart(
        settings: Settings, recs: list[Any]) -> None:
    with TestClient(create_app(settings)) as client:
        with client.websocket_connect("/ws/ingest") as ws:
            assert hello(ws, KEY) == -1
            assert send(ws, recs[:10]) == 9
        with client.websocket_connect("/ws/ingest") as ws:
            assert hello(ws, KEY) == 9
            assert send(ws, recs[10:20]) == 19
    with TestClient(create_app(settings)) as client:  # the key hash is on disk
        assert refused(client, [batch(recs[20:30])])[0] == OWNED
        with client.websocket_connect("/ws/ingest") as ws:
            assert hello(ws, KEY) == 19
            assert send(ws, recs[20:]) == len(recs) - 1
        assert client.get("/api/runs/run1").json()["steps"] == 40


def test_a_keyless_stream_stays_open_to_keyless_writers(
        client: TestClient, recs: list[Any]) -> None:
    with client.websocket_connect("/ws/ingest") as ws:  # an old probe: no key
        assert hello(ws, None) == -1
        assert send(ws, recs[:10]) == 9
    with client.websocket_connect("/ws/ingest") as ws:
        assert send(ws, recs[10:]) == len(recs) - 1


def test_the_ack_is_the_contiguous_prefix_never_the_highest_seq(
        settings: Settings, recs: list[Any]) -> None:
    with TestClient(create_app(settings)) as client:
        with client.websocket_connect("/ws/ingest") as ws:
            assert hello(ws, KEY) == -1
            assert send(ws, recs[:10]) == 9
            assert send(ws, recs[15:25]) == 9  # seqs 10-14 missing: the ack stays
            assert send(ws, [recs[10], recs[12]]) == 10
            assert hello(ws, KEY) == 10  # resume answers the same
        with client.websocket_connect("/ws/ingest") as ws:
            assert hello(ws, KEY) == 10
    with TestClient(create_app(settings)) as client:
        with client.websocket_connect("/ws/ingest") as ws:
            assert hello(ws, KEY) == 10  # also after a restart
            assert send(ws, [recs[11], recs[13], recs[14]]) == 24  # gap filled: 0-24
            assert send(ws, recs[25:]) == len(recs) - 1
        got = client.get("/api/runs/run1").json()
        assert got["steps"] == 40 and got["status"] == "finished"
        steps = client.get("/api/runs/run1/steps?max_points=100000").json()["step"]
        assert steps == list(range(40))


def test_a_gap_left_by_a_foreign_high_seq_cannot_make_the_owner_skip(
        client: TestClient, recs: list[Any]) -> None:
    """Without a key (an old probe) a stranger can still add records, but the resume
    position stays where the owner's records end: no record of its is skipped."""
    with client.websocket_connect("/ws/ingest") as ws:
        assert hello(ws, None) == -1
        assert send(ws, recs[:10]) == 9
    with client.websocket_connect("/ws/ingest") as ws:
        assert send(ws, [synth.step(5000, 4999)]) == 9
        assert hello(ws, None) == 9


def test_hello_keys_are_bounded(client: TestClient) -> None:
    for key in ("short", "x" * 200, "bad key with spaces!" * 2):
        frame = json.dumps({"type": "hello", "v": 1, "run": "run1", "rank": 0, "key": key})
        code, reason = refused(client, [frame])
        assert code == 1007 and "field 'key' of the 'hello' frame" in reason, (key, reason)


def test_a_data_directory_from_before_keys_opens_and_acks_as_it_did(
        settings: Settings) -> None:
    release = Path(__file__).parent / "fixtures" / "release-current.db"
    old = sqlite3.connect(release)
    (top,) = old.execute("SELECT s.max_seq FROM streams s JOIN runs r ON r.rid=s.rid "
                         "WHERE r.id='beta' AND s.rank=0").fetchone()
    old.close()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(release, settings.data_dir / db.DB_NAME)
    with TestClient(create_app(settings)) as client:
        with client.websocket_connect("/ws/ingest") as ws:
            assert hello(ws, KEY, run="beta") == top  # its ack was the highest seq: kept
        with client.websocket_connect("/ws/ingest") as ws:  # still keyless: open to all
            end = End(seq=top + 1, t=2e9, status="finished", steps=0)
            assert send(ws, [end], run="beta") == top + 1
