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
from gradwatch.server.errors import NewerDatabase
from gradwatch.server.pgschema import SCHEMA_VERSION
from gradwatch.server.storage import Store
from gradwatch.steplog import read_log
from gradwatch.verdict import verdict_of
from tests.pgcluster import free_port


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
    from gradwatch.server.batch import batch_of_records
    return batch_of_records("run1", 0, synth.records(steps=5, end=False))


def test_an_unreachable_database_is_named_without_its_password() -> None:
    url = f"postgresql://alice:pw-s3cret@127.0.0.1:{free_port()}/gw"
    with pytest.raises(psycopg.Error) as e:
        Store(url)
    assert "alice:***@127.0.0.1" in str(e.value) and "pw-s3cret" not in str(e.value)
