"""A client that sends frames faster than the server stores them (more than the ingest
pipeline holds unacked: the probe never does): its frames of one stream are merged while
the pipeline is full (``server/ws_ingest.py``), each still acked in order, every record
stored once. Over both backends."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import synth
from apps import app_settings
from fastapi.testclient import TestClient

from gradwatch.frames import Ack
from gradwatch.server import create_app
from gradwatch.server.ws_ingest import MERGE, MERGE_RECORDS, IngestSession


def send_while_writer_busy(client: TestClient, frames: list[str], monkeypatch: Any
                           ) -> tuple[list[int], list[int]]:
    """Send ``frames`` on one connection, no ack awaited, while the writer is held busy
    until all are read; the acks, and the records of each batch the writer stored."""
    runs = client.app.state.runs  # type: ignore[attr-defined]
    stored: list[int] = []  # records per batch the writer stored
    parsed = [0]
    ingest, parse = runs.store.ingest, runs.parser.parse

    def counting_ingest(batch: Any, *a: Any) -> Any:
        stored.append(len(batch.entries))
        return ingest(batch, *a)

    async def counting_parse(text: str) -> Any:
        frame = await parse(text)
        parsed[0] += 1
        return frame

    monkeypatch.setattr(runs.store, "ingest", counting_ingest)
    monkeypatch.setattr(runs.parser, "parse", counting_parse)
    gate = threading.Event()
    runs.store.submit(gate.wait, 30.0)  # the writer busy: frames wait for it
    with client.websocket_connect("/ws/ingest") as ws:
        for f in frames:  # all sent, no ack awaited
            ws.send_text(f)
        # Until every frame is parsed, or the connection stops reading (a merged batch
        # full: the rest wait for the writer); then the last parsed one is merged (no
        # await after the parse).
        deadline, seen, still = time.monotonic() + 60, -1, time.monotonic()
        while parsed[0] < len(frames) and time.monotonic() < deadline:
            if parsed[0] != seen:
                seen, still = parsed[0], time.monotonic()
            elif time.monotonic() - still > 1.0:
                break
            time.sleep(0.01)
        time.sleep(0.1)
        gate.set()
        acks = [Ack.model_validate_json(ws.receive_text()).seq for _ in frames]
    return acks, stored


def test_frames_sent_faster_than_stored_are_merged_acked_each_and_stored_once(
        where: Path | str, tmp_path: Path, monkeypatch: Any) -> None:
    recs = synth.records(steps=200, stale_from=150)
    frames = synth.batches(recs, "run1", 0, 10)
    settings = app_settings(data_dir=tmp_path / "data", max_msgs_per_sec=100_000,
                            db=where if isinstance(where, str) else None)
    with TestClient(create_app(settings)) as client:
        acks, stored = send_while_writer_busy(client, frames, monkeypatch)
        # one ack per frame, in order, never going back; the last says all is stored
        assert len(acks) == len(frames) and acks == sorted(acks) and acks[-1] == recs[-1].seq
        # the first frames went one a batch (the pipeline and the acker's), the rest
        # merged up to MERGE frames a batch: fewer transactions than frames
        one_each = IngestSession.PIPELINE + 1
        assert len(stored) < len(frames)
        assert sum(stored) == len(recs) and max(stored) <= MERGE * 10
        assert stored[:one_each] == [10] * one_each
        run = client.get("/api/runs/run1").json()
        assert run["steps"] == 200 and run["status"] == "finished" and run["findings"] >= 1
        steps = client.get("/api/runs/run1/steps?max_points=1000").json()
        assert steps["step"] == list(range(200))


def test_big_frames_are_merged_only_up_to_merge_records(
        where: Path | str, tmp_path: Path, monkeypatch: Any) -> None:
    """A merged batch holds the writer as long as its records take; a live client's batch
    waits for it (it goes ahead of queued batches only), so merging stops at
    MERGE_RECORDS records."""
    recs = synth.records(steps=2000)
    size = 2 * MERGE_RECORDS // 5  # two merge, three would pass MERGE_RECORDS
    frames = synth.batches(recs, "run1", 0, size)
    settings = app_settings(data_dir=tmp_path / "data", max_msgs_per_sec=100_000,
                            db=where if isinstance(where, str) else None)
    with TestClient(create_app(settings)) as client:
        acks, stored = send_while_writer_busy(client, frames, monkeypatch)
        assert acks[-1] == recs[-1].seq and acks == sorted(acks)
        assert sum(stored) == len(recs) and len(stored) < len(frames)  # some merged
        assert max(stored) <= MERGE_RECORDS
        assert client.get("/api/runs/run1").json()["steps"] == 2000
