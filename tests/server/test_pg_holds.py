"""Servers sharing a PostgreSQL database mark a run interrupted only when no server holds
its stream (server/pgholds.py): a server starting beside a live stream leaves it live, and
a server whose connection of a run dropped leaves it to the server the probe moved to.
And a row two servers add at once (a reset set) is kept once, neither batch refused."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psycopg
import synth
from websockets.sync.client import connect

from gradwatch.server.batch import batch_of_records
from gradwatch.server.storage import Store
from tests.serverproc import ServerProc


def status(url: str, run: str) -> str:
    with psycopg.connect(url) as c:
        row = c.execute("SELECT status FROM runs WHERE id=%s", (run,)).fetchone()
    assert row is not None, f"no run {run}"
    return str(row[0])


def waiting_for(url: str, pid: int) -> None:
    """Return once a session of ``url`` waits for a lock that backend ``pid`` holds."""
    deadline = time.monotonic() + 30
    with psycopg.connect(url, autocommit=True) as c:
        while not c.execute("SELECT 1 FROM pg_stat_activity WHERE %s = ANY("
                            "pg_blocking_pids(pid))", (pid,)).fetchone():
            assert time.monotonic() < deadline, "no session waited on the other's row"
            time.sleep(0.05)


def test_a_stream_that_moved_to_another_server_is_not_marked_interrupted(
        pg_cluster: Any) -> None:
    url = pg_cluster.new_database()
    a, b = Store(url), Store(url)
    a.start()
    b.start()
    try:
        recs = synth.records(steps=40)
        a.call(a.ingest, batch_of_records("run1", 0, recs[:20]))  # the probe streams to A,
        b.call(b.ingest, batch_of_records("run1", 0, recs[20:30]))  # then moves to B
        # A's connection of the run is gone: A lets go, and B still has the stream.
        assert a.call(a.mark_interrupted, "run1") is None
        assert status(url, "run1") == "live"
        c = Store(url)  # a server starting: the run is B's, not one lost at a shutdown
        c.close()
        assert status(url, "run1") == "live"
        # B loses it too: no server holds it now.
        summary = b.call(b.mark_interrupted, "run1")
        assert summary is not None and summary.status == "interrupted"
        assert status(url, "run1") == "interrupted"
        # The probe comes back (to A): live again, and ended whole.
        res = a.call(a.ingest, batch_of_records("run1", 0, recs[30:]))
        assert res.ack == len(recs) - 1 and status(url, "run1") == "finished"
        assert b.reader.summary("run1").steps == 40  # type: ignore[union-attr]
    finally:
        a.close()
        b.close()


def test_a_server_starting_beside_live_streams_marks_only_the_unheld(
        pg_cluster: Any, tmp_path: Path) -> None:
    """Real servers: A takes a stream and keeps it open; C takes another and is killed
    (-9), so no server holds that run; B starts on the database and marks only C's run
    interrupted, while A's goes on to its end."""
    url = pg_cluster.new_database()
    held = synth.records("held", steps=60)
    orphan = synth.records("orphan", steps=30, end=False)
    a = ServerProc(tmp_path / "a", None, "--db", url).start()
    c = ServerProc(tmp_path / "c", None, "--db", url).start()
    b = ServerProc(tmp_path / "b", None, "--db", url)
    try:
        with connect(f"{a.ws}/ws/ingest", open_timeout=5) as to_a:
            frames = synth.batches(held, "held", 0, 10)
            for frame in frames[:3]:
                to_a.send(frame)
                to_a.recv(timeout=10)
            with connect(f"{c.ws}/ws/ingest", open_timeout=5) as to_c:
                for frame in synth.batches(orphan, "orphan", 0, 10):
                    to_c.send(frame)
                    to_c.recv(timeout=10)
                c.kill9()
            b.start()
            runs = {r["id"]: r["status"] for r in b.get("/api/runs")["runs"]}
            assert runs == {"held": "live", "orphan": "interrupted"}
            assert status(url, "held") == "live"
            for frame in frames[3:]:  # A's stream goes on, to its end
                to_a.send(frame)
                to_a.recv(timeout=10)
        assert b.get("/api/runs/held")["status"] == "finished"
        assert b.get("/api/runs/held")["steps"] == 60
    finally:
        c.kill9()
        b.stop()
        a.stop()


def test_a_run_whose_server_died_reads_interrupted_on_the_servers_still_running(
        pg_cluster: Any, tmp_path: Path) -> None:
    """C takes a stream and is killed (-9) with its probe gone too: the servers still
    running find the run held by none and mark it interrupted (a sweep every
    ``--interrupted-after``, here 1 s), while A's stream, held, stays live."""
    url = pg_cluster.new_database()
    held = synth.records("held", steps=30)
    orphan = synth.records("orphan", steps=30, end=False)
    a = ServerProc(tmp_path / "a", None, "--db", url).start()
    b = ServerProc(tmp_path / "b", None, "--db", url).start()
    c = ServerProc(tmp_path / "c", None, "--db", url).start()
    try:
        with connect(f"{a.ws}/ws/ingest", open_timeout=5) as to_a:
            frames = synth.batches(held, "held", 0, 10)
            to_a.send(frames[0])
            to_a.recv(timeout=10)
            with connect(f"{c.ws}/ws/ingest", open_timeout=5) as to_c:
                for frame in synth.batches(orphan, "orphan", 0, 10):
                    to_c.send(frame)
                    to_c.recv(timeout=10)
                assert b.get("/api/runs/orphan")["status"] == "live"
                c.kill9()
            deadline = time.monotonic() + 30
            while b.get("/api/runs/orphan")["status"] == "live":
                assert time.monotonic() < deadline, "the orphaned run stayed live"
                time.sleep(0.2)
            assert b.get("/api/runs/orphan")["status"] == "interrupted"
            assert a.get("/api/runs/orphan")["status"] == "interrupted"
            assert status(url, "held") == "live"
            for frame in frames[1:]:
                to_a.send(frame)
                to_a.recv(timeout=10)
        assert b.get("/api/runs/held")["status"] == "finished"
    finally:
        c.kill9()
        b.stop()
        a.stop()


def test_servers_adding_the_same_reset_set_at_once_keep_it_once(pg_cluster: Any) -> None:
    """Another server's transaction adds the reset set a batch needs and commits while
    this server's insert waits on it: the batch is stored on that row, not refused."""
    url = pg_cluster.new_database()
    recs = synth.records(steps=5)
    first = Store(url)  # the body of the steps' reset set, as a server stores it
    first.start()
    first.call(first.ingest, batch_of_records("probe", 0, synth.records("probe", steps=5)))
    first.close()
    with psycopg.connect(url, autocommit=True) as c:
        body, summary = c.execute("SELECT body, summary FROM reset_sets").fetchone()
        c.execute("DELETE FROM reset_sets")
    s = Store(url)
    s.start()
    other = psycopg.connect(url)  # another server, mid-transaction
    try:
        other.execute("INSERT INTO reset_sets(body, summary) VALUES(%s, %s)", (body, summary))
        stored = s.submit(s.ingest, batch_of_records("run1", 0, recs))
        waiting_for(url, other.info.backend_pid)  # the writer's insert waits on that row
        other.commit()
        assert stored.result(30).ack == len(recs) - 1
        with psycopg.connect(url) as c:
            assert c.execute("SELECT count(*) FROM reset_sets").fetchone() == (1,)
        got = s.reader.steps("run1", max_points=100)
        assert got is not None and len(got.rows) == 5
    finally:
        other.close()
        s.close()
