"""The server on PostgreSQL (``--db postgresql://...``): the app end to end, the schema's
versions, and errors that name the database without its password. The storage tests
themselves run over both backends (the ``where`` fixture)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest
import synth
from apps import app_settings
from fastapi.testclient import TestClient

from gradwatch.frames import Hello
from gradwatch.server import create_app
from gradwatch.server.batch import batch_of_records
from gradwatch.server.errors import NewerDatabase, StorageFailed, StreamOwned
from gradwatch.server.migrate import statements
from gradwatch.server.pgdb import PostgresDatabase
from gradwatch.server.pgschema import SCHEMA, SCHEMA_VERSION
from gradwatch.server.storage import Store
from gradwatch.steplog import read_log
from gradwatch.verdict import verdict_of
from tests.pgcluster import Cluster, free_port
from tests.serverproc import ServerProc


def ingest(client: TestClient, recs: list[Any], run: str = "run1") -> list[Any]:
    with client.websocket_connect("/ws/ingest") as ws:
        acks = []
        for frame in synth.batches(recs, run, 0, 25):
            ws.send_text(frame)
            acks.append(ws.receive_json())
    return acks


def test_the_server_on_postgresql_ingests_serves_exports_and_restarts(
        pg_cluster: Any, tmp_path: Path) -> None:
    url = pg_cluster.new_database()
    settings = app_settings(data_dir=tmp_path / "unused", db=url, interrupted_after=0.2)
    done = synth.records(steps=120, stale_from=80)
    live = synth.records("run2", steps=40, end=False)
    with TestClient(create_app(settings)) as client:
        assert ingest(client, done)[-1]["seq"] == len(done) - 1
        ingest(client, live[:30], "run2")
        runs = {r["id"]: r for r in client.get("/api/runs").json()["runs"]}
        assert runs["run1"]["status"] == "finished" and runs["run1"]["steps"] == 120
        steps = client.get("/api/runs/run1/steps").json()
        assert steps["step"] == list(range(120))
        got = client.get("/api/runs/run1/findings").json()["findings"]
        assert got == [f.model_dump(mode="json") for f in verdict_of(done).findings()]
        text = client.get("/api/runs/run1/export").text
        log = tmp_path / "back.jsonl"
        log.write_text(text)
        assert len(read_log(log).records) == len(done) - 1  # all but the header
    assert not (tmp_path / "unused").exists()  # nothing went to a data directory
    with TestClient(create_app(settings)) as client:  # a restart: the same database
        assert client.get("/api/runs/run2").json()["status"] == "interrupted"
        with client.websocket_connect("/ws/ingest") as ws:
            ws.send_text(Hello(run="run2").model_dump_json())
            assert ws.receive_json()["seq"] == 29
        ingest(client, live[30:], "run2")
        assert client.get("/api/runs/run2").json()["steps"] == 40


def test_servers_starting_together_create_the_schema_once(pg_cluster: Any) -> None:
    url = pg_cluster.new_database()
    errors: list[BaseException] = []

    def start() -> None:
        try:
            Store(url).close()
        except BaseException as e:  # handed to the test
            errors.append(e)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with psycopg.connect(url) as c:
        assert c.execute("SELECT version FROM gradwatch_schema").fetchall() == [
            (SCHEMA_VERSION,)]


def test_a_database_of_a_newer_gradwatch_is_refused_untouched(pg_cluster: Any) -> None:
    url = pg_cluster.new_database()
    s = Store(url)
    s.start()
    s.call(s.ingest, synth_batch())
    s.close()
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("UPDATE gradwatch_schema SET version = %s", (SCHEMA_VERSION + 1,))
    with pytest.raises(NewerDatabase, match="newer gradwatch"):
        Store(url)
    with psycopg.connect(url) as c:
        assert c.execute("SELECT count(*) FROM steps").fetchone() == (5,)


def synth_batch() -> Any:
    return batch_of_records("run1", 0, synth.records(steps=5, end=False))


def test_an_unreachable_database_is_named_without_its_password() -> None:
    url = f"postgresql://alice:pw-s3cret@127.0.0.1:{free_port()}/gw"
    with pytest.raises(psycopg.Error) as e:
        Store(url)
    assert "alice:***@127.0.0.1" in str(e.value) and "pw-s3cret" not in str(e.value)


def test_a_server_started_with_a_password_in_db_never_shows_it(
        pg_cluster: Any, tmp_path: Path) -> None:
    """The start line, the log and the API name the database without its password (the
    throwaway cluster trusts loopback, so any password connects); the user is told that
    ps shows it."""
    url = pg_cluster.new_database().replace("postgres@", "postgres:pw-s3cret@")
    srv = ServerProc(tmp_path / "data", None, "--db", url, "--log-level", "info")
    with srv:
        runs = srv.get("/api/runs")
        health = srv.get("/healthz")
    out = srv.log.read_text()
    assert "postgres:***@127.0.0.1" in out and "visible in ps" in out
    assert "pw-s3cret" not in out + repr(runs) + repr(health)


def test_a_runs_generation_is_read_once_its_lock_is_held(pg_cluster: Any) -> None:
    """A server waiting for a run's lock reads the generation the server before it
    committed (its read is not a snapshot taken before the wait): else it would go on
    from a stale state of the run."""
    url = pg_cluster.new_database()
    Store(url).close()  # the schema
    db = PostgresDatabase(url)
    first, second = db.open_writer(), db.open_writer()
    got: list[int] = []
    try:
        first.raw.execute("BEGIN")
        assert db.lock_run(first, "run1") == 0
        db.bump(first, "run1", 1, "{}")

        def waiter() -> None:
            second.raw.execute("BEGIN")
            got.append(db.lock_run(second, "run1"))  # waits for the first's COMMIT
            second.raw.execute("COMMIT")

        t = threading.Thread(target=waiter)
        t.start()
        t.join(1.0)
        assert t.is_alive() and got == []  # it waits for the lock
        first.raw.execute("COMMIT")
        t.join(30)
        assert got == [1]
    finally:
        first.close()
        second.close()


def test_two_servers_on_one_database_take_turns_at_a_stream(pg_cluster: Any) -> None:
    """A stream moves between servers (a restart, a balancer): the one it moves to
    rebuilds the run's state from the database, so acks, ownership and findings go on."""
    url = pg_cluster.new_database()
    a, b = Store(url), Store(url)
    a.start()
    b.start()
    try:
        recs = synth.records(steps=200, stale_from=60)
        key = "k-123"
        parts = [recs[i:i + 15] for i in range(0, len(recs), 15)]
        for i, part in enumerate(parts):  # every batch to the other server than the last
            s = (a, b)[i % 2]
            res = s.call(s.ingest, batch_of_records("run1", 0, part), None, key)
            assert res.ack == part[-1].seq
            other = (b, a)[i % 2]  # the resume position is the database's, on any server
            assert other.call(other.resume_seq, "run1", 0, key) == part[-1].seq
        with pytest.raises(StreamOwned):
            b.call(b.ingest, batch_of_records("run1", 0, recs[-3:]), None, "wrong")
        got = a.reader.findings("run1")
        assert got == verdict_of(recs).findings()
        summary = b.reader.summary("run1")
        assert summary is not None and summary.steps == 200
        assert summary.status == "finished"
        # Both servers handed the same resend at once: stored once, both acked.
        errors: list[BaseException] = []
        acks: list[int] = []

        def resend(s: Store) -> None:
            try:
                acks.append(s.call(s.ingest, batch_of_records("run1", 0, recs[50:120]),
                                   None, key).ack)
            except BaseException as e:  # handed to the test
                errors.append(e)

        threads = [threading.Thread(target=resend, args=(s,)) for s in (a, b, a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [] and acks == [len(recs) - 1] * 4
        rows = a.reader.steps("run1", max_points=10_000)
        assert rows is not None and [r.step for r in rows.rows] == list(range(200))
    finally:
        a.close()
        b.close()


def test_a_schema_4_database_migrates_keeping_its_runs(pg_cluster: Any) -> None:
    url = pg_cluster.new_database()
    with psycopg.connect(url, autocommit=True) as c:  # as the first release wrote it
        for s in statements(SCHEMA):
            c.execute(s)
        c.execute("CREATE TABLE gradwatch_schema(version INTEGER NOT NULL)")
        c.execute("INSERT INTO gradwatch_schema VALUES(4)")
    s = Store(url)
    s.start()
    s.call(s.ingest, synth_batch())
    s.close()
    with psycopg.connect(url) as c:
        assert c.execute("SELECT version FROM gradwatch_schema").fetchone() == (
            SCHEMA_VERSION,)
        assert c.execute("SELECT count(*) FROM steps").fetchone() == (5,)
        assert c.execute("SELECT gen FROM run_writers").fetchall() == [(1,)]


def test_a_dashboard_on_one_server_sees_a_run_written_through_another(
        pg_cluster: Any, tmp_path: Path) -> None:
    url = pg_cluster.new_database()
    recs = synth.records(steps=80, stale_from=50)
    a = TestClient(create_app(app_settings(data_dir=tmp_path / "a", db=url)))
    b = TestClient(create_app(app_settings(data_dir=tmp_path / "b", db=url)))
    with a, b:
        ingest(a, recs[:30])
        with b.websocket_connect("/ws/live?run=run1") as live:
            snap = live.receive_json()
            assert snap["type"] == "snapshot" and snap["steps"]["step"] == list(range(28))
            ingest(a, recs[30:])  # through server A, to its end
            seen: list[int] = []
            kinds: set[str] = set()
            status = None
            while status != "finished" or seen != list(range(28, 80)) or \
                    "findings" not in kinds:
                f = live.receive_json()
                kinds.add(f["type"])
                if f["type"] == "steps":
                    seen += f["steps"]["step"]
                elif f["type"] == "run":
                    status = f["run"]["status"]
                elif f["type"] == "findings":
                    assert f["findings"][0]["first_step"] == 50
        assert b.get("/api/runs/run1").json()["steps"] == 80


def test_a_database_restart_refuses_a_batch_then_storing_goes_on() -> None:
    """The database restarts under a running server: the batch that meets it is refused
    whole (the probe resends it), the next ones are stored on a new connection."""
    cluster = Cluster()  # its own: restarted below
    try:
        url = cluster.new_database()
        s = Store(url)
        s.start()
        recs = synth.records(steps=60, end=True)
        s.call(s.ingest, batch_of_records("run1", 0, recs[:30]))
        cluster.restart()
        refused = 0
        for part in (recs[30:45], recs[30:45], recs[45:]):  # a refused batch is resent
            try:
                s.call(s.ingest, batch_of_records("run1", 0, part))
            except StorageFailed:
                refused += 1
        assert refused <= 1
        assert s.call(s.resume_seq, "run1", 0) == len(recs) - 1
        got = s.reader.steps("run1", max_points=1000)
        assert got is not None and [r.step for r in got.rows] == list(range(60))
        assert s.reader.summary("run1").status == "finished"  # type: ignore[union-attr]
        s.close()
    finally:
        cluster.stop()


def test_a_write_refused_late_in_a_batch_refuses_it_whole(pg_cluster: Any) -> None:
    """The writer sends a batch's statements without waiting for each (psycopg's
    pipeline): one the database refuses after the batch's rows and packs were sent (here
    the stream's row, written last) still refuses the batch whole: nothing of it is
    stored or counted, and the resend is stored once, the writer going on as before."""
    url = pg_cluster.new_database()
    s = Store(url)
    s.start()
    try:
        with psycopg.connect(url, autocommit=True) as c:
            c.execute("CREATE TABLE refuse(x INT)")
            c.execute("CREATE FUNCTION refuse_streams() RETURNS trigger LANGUAGE plpgsql AS "
                      "$$ BEGIN IF EXISTS (SELECT 1 FROM refuse) THEN RAISE EXCEPTION "
                      "'refused for the test'; END IF; RETURN NEW; END $$")
            c.execute("CREATE TRIGGER refuse BEFORE INSERT OR UPDATE ON streams "
                      "FOR EACH ROW EXECUTE FUNCTION refuse_streams()")
            recs = synth.records(steps=200, end=True)
            s.call(s.ingest, batch_of_records("run1", 0, recs[:70]))
            c.execute("INSERT INTO refuse VALUES(1)")
            with pytest.raises(StorageFailed):  # steps 68.. span packed chunks: sent
                s.call(s.ingest, batch_of_records("run1", 0, recs[70:160]))
            assert s.call(s.resume_seq, "run1", 0) == 69
            assert c.execute("SELECT count(*), max(step) FROM steps").fetchone() == (68, 67)
            assert s.reader.summary("run1").steps == 68  # type: ignore[union-attr]
            c.execute("DELETE FROM refuse")
            for part in (recs[70:160], recs[70:160], recs[160:]):  # resent twice
                s.call(s.ingest, batch_of_records("run1", 0, part))
            assert c.execute("SELECT count(*), count(DISTINCT step) FROM steps"
                             ).fetchone() == (200, 200)
        assert s.call(s.resume_seq, "run1", 0) == len(recs) - 1
        got = s.reader.steps("run1", max_points=1000)
        assert got is not None and [r.step for r in got.rows] == list(range(200))
        summary = s.reader.summary("run1")
        assert summary is not None and summary.steps == 200 and summary.status == "finished"
    finally:
        s.close()
