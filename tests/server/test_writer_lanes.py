"""The storage writer's lanes (``server/writerthread.py``): a live client's small batch
goes ahead of other runs' queued bulk batches, without reordering a run's jobs, passing a
job of no run, or starving the bulk. Through the ingest route over both backends, and on
the writer thread alone for each rule."""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import synth
from apps import app_settings
from fastapi.testclient import TestClient

from gradwatch.frames import Ack
from gradwatch.server import create_app
from gradwatch.server.errors import StoreBusy
from gradwatch.server.writerthread import FAIR, WriterThread
from gradwatch.server.ws_ingest import LIVE_RECORDS


class Writer:
    """A started writer held busy until :meth:`go`; :attr:`done` lists jobs as run."""

    def __init__(self, size: int = 256) -> None:
        self.thread = WriterThread(lambda stop: None, size)
        self.thread.start()
        self.gate = threading.Event()
        self.done: list[str] = []
        self.futures: list[cf.Future[Any]] = [self.thread.submit(self.gate.wait, 30.0)]
        time.sleep(0.05)  # the gate is running: every job below waits in the lanes

    def add(self, name: str, run: str | None, urgent: bool = False,
            timer: bool = False) -> None:
        self.futures.append(self.thread.submit(self.done.append, name, run=run,
                                               urgent=urgent, timer=timer))

    def go(self) -> list[str]:
        self.gate.set()
        cf.wait(self.futures, 30)
        self.thread.stop()
        return self.done


def test_a_small_batch_goes_ahead_of_other_runs_queued_jobs() -> None:
    w = Writer()
    w.add("a1", "a")
    w.add("b1", "b")
    w.add("a2", "a")
    w.add("live1", "live", urgent=True)
    w.add("live2", "live", urgent=True)
    assert w.go() == ["live1", "live2", "a1", "b1", "a2"]


def test_a_runs_jobs_keep_their_order_whatever_their_lane() -> None:
    w = Writer()
    w.add("a1", "a")
    w.add("a2", "a", urgent=True)  # behind a1 (queued): never ahead of it
    w.add("live1", "live", urgent=True)
    w.add("live2", "live")  # behind live1 (urgent): goes with it
    w.add("b1", "b")
    assert w.go() == ["live1", "live2", "a1", "a2", "b1"]


def test_no_urgent_job_passes_a_job_of_no_run() -> None:
    w = Writer()
    w.add("a1", "a")
    w.add("live1", "live", urgent=True)  # before the barrier: may go first
    w.add("delete", None)  # e.g. marking a run interrupted: touches any run
    w.add("live2", "live", urgent=True)  # after it: waits for it
    w.add("b1", "b")
    done = w.go()
    assert done == ["live1", "a1", "delete", "live2", "b1"]


def test_a_timers_job_of_no_run_holds_no_urgent_job_back() -> None:
    w = Writer()
    w.add("a1", "a")
    w.add("sweep", None, timer=True)  # its moment is arbitrary: passing it changes nothing
    w.add("live1", "live", urgent=True)
    w.add("b1", "b")
    assert w.go() == ["live1", "a1", "sweep", "b1"]


def test_bulk_runs_after_fair_urgent_jobs_in_a_row() -> None:
    w = Writer()
    w.add("bulk", "b")
    for i in range(3 * FAIR):
        w.add(f"live{i}", f"live{i % 3}", urgent=True)
    done = w.go()
    assert done.index("bulk") == FAIR
    assert [d for d in done if d != "bulk"] == [f"live{i}" for i in range(3 * FAIR)]


def test_both_lanes_together_are_bounded_and_drained_at_stop() -> None:
    w = Writer(size=4)
    w.add("a1", "a")
    w.add("live1", "live", urgent=True)
    w.add("b1", None)
    w.add("a2", "a")
    with pytest.raises(StoreBusy):
        w.add("live2", "live", urgent=True)
    w.futures.pop()  # the gate's job is running, not queued: 4 queued
    w.gate.set()
    w.thread.stop()  # runs what is queued first
    assert w.done == ["live1", "a1", "b1", "a2"]


def test_a_live_frame_is_stored_before_other_streams_queued_bulk_frames(
        where: Path | str, tmp_path: Path, monkeypatch: Any) -> None:
    bulk_recs = synth.records("bulk", steps=4 * LIVE_RECORDS, stale_from=10_000)
    bulk = synth.batches(bulk_recs, "bulk", 0, 2 * LIVE_RECORDS)
    live_recs = synth.records("live", steps=40, stale_from=10_000, end=False)
    live = synth.batches(live_recs, "live", 0, 10)
    settings = app_settings(data_dir=tmp_path / "data", max_msgs_per_sec=100_000,
                            db=where if isinstance(where, str) else None)
    with TestClient(create_app(settings)) as client:
        runs = client.app.state.runs  # type: ignore[attr-defined]
        order: list[tuple[str, int]] = []  # (run, records) per batch, as stored
        ingest = runs.store.ingest

        def recording_ingest(batch: Any, *a: Any) -> Any:
            order.append((batch.run, len(batch.entries)))
            return ingest(batch, *a)

        monkeypatch.setattr(runs.store, "ingest", recording_ingest)
        with client.websocket_connect("/ws/ingest") as lws:
            lws.send_text(live[0])  # the live run's header batch, stored now
            lws.receive_text()
            gate = threading.Event()
            runs.store.submit(gate.wait, 30.0)  # the writer busy: the frames wait
            with client.websocket_connect("/ws/ingest") as bws:
                for f in bulk[:2]:
                    bws.send_text(f)
                deadline = time.monotonic() + 30
                lanes = runs.store._writer._lanes
                while len(lanes) < 2 and time.monotonic() < deadline:
                    time.sleep(0.01)
                lws.send_text(live[1])
                while len(lanes) < 3 and time.monotonic() < deadline:
                    time.sleep(0.01)
                gate.set()
                live_ack = Ack.model_validate_json(lws.receive_text())
                for f in bulk[2:]:
                    bws.send_text(f)
                bulk_acks = [Ack.model_validate_json(bws.receive_text()).seq for _ in bulk]
        # the live frame (10 records) was stored first, the bulk frames in their order
        assert order[1:4] == [("live", 10), ("bulk", 2 * LIVE_RECORDS),
                              ("bulk", 2 * LIVE_RECORDS)]
        assert live_ack.seq == live_recs[19].seq
        assert bulk_acks == sorted(bulk_acks) and bulk_acks[-1] == bulk_recs[-1].seq
        assert client.get("/api/runs/bulk").json()["steps"] == 4 * LIVE_RECORDS
        steps = client.get("/api/runs/live/steps?max_points=1000").json()
        assert steps["step"] == list(range(18))  # the header batch's 8, then 10
