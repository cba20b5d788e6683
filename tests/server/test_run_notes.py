"""Run notes and tags (``PATCH /api/runs/{id}``): stored, listed, sent to live clients,
kept over a restart, in a step-log export and through its import; bad ones refused with a
sentence; a database from before them (schema 3) migrates with empty ones."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
import synth
from apps import app_settings
from fastapi.testclient import TestClient

from gradwatch.server import Settings, create_app, db
from gradwatch.steplog import read_log

NDJSON = {"content-type": "application/x-ndjson"}
NOTES = "lr warm-up too short?\nsecond try: 500 steps of warm-up"


def ingest(client: TestClient, recs: list, run: str = "run1") -> None:
    with client.websocket_connect("/ws/ingest") as ws:
        for frame in synth.batches(recs, run, size=50):
            ws.send_text(frame)
            ws.receive_json()


def listed(client: TestClient) -> dict[str, tuple[str, list[str]]]:
    return {r["id"]: (r["notes"], r["tags"]) for r in client.get("/api/runs").json()["runs"]}


def test_notes_and_tags_are_stored_listed_sent_live_kept_and_exported(
        settings: Settings, tmp_path: Path) -> None:
    with TestClient(create_app(settings)) as client:
        ingest(client, synth.records(steps=20))
        assert listed(client) == {"run1": ("", [])}
        with client.websocket_connect("/ws/live") as runs_ws:
            assert runs_ws.receive_json()["type"] == "runs"
            r = client.patch("/api/runs/run1", json={
                "notes": NOTES + "  \n", "tags": [" baseline ", "warmup", "baseline", ""]})
            assert r.status_code == 200, r.text
            assert (r.json()["notes"], r.json()["tags"]) == (NOTES, ["baseline", "warmup"])
            frame = runs_ws.receive_json()
            assert frame["type"] == "run" and frame["run"]["tags"] == ["baseline", "warmup"]
        # Tags alone leave the notes (and the name) as they were.
        r = client.patch("/api/runs/run1", json={"tags": ["baseline", "ablation"]})
        assert r.json()["notes"] == NOTES and r.json()["name"] == "run1"
        log = client.get("/api/runs/run1/export?format=jsonl").text
    with TestClient(create_app(settings)) as client:
        assert listed(client) == {"run1": (NOTES, ["baseline", "ablation"])}
        assert client.get("/api/runs/run1").json()["tags"] == ["baseline", "ablation"]
    path = tmp_path / "run1.jsonl"
    path.write_text(log)
    header = read_log(path).header
    assert (header.notes, header.tags) == (NOTES, ["baseline", "ablation"])
    # Imported on another server, the run keeps them.
    other = app_settings(data_dir=tmp_path / "other")
    with TestClient(create_app(other)) as client:
        r = client.post("/api/runs/import", content=log, headers=NDJSON)
        assert r.status_code == 201, r.text
        assert listed(client)[r.json()["run"]] == (NOTES, ["baseline", "ablation"])


@pytest.mark.parametrize(("body", "says"), [
    ({}, "nothing to change"),
    ({"notes": "x" * 10_001}, "at most 10000 characters"),
    ({"tags": ["ok", "x" * 65]}, "1-64 characters"),
    ({"tags": ["new\nline"]}, "control characters"),
    ({"tags": [f"t{i}" for i in range(33)]}, "at most 32 tags"),
    ({"name": "", "notes": "kept?"}, "cannot be empty"),
])
def test_bad_notes_or_tags_say_why_and_change_nothing(client: TestClient, body: dict,
                                                      says: str) -> None:
    ingest(client, synth.records(steps=5))
    assert client.patch("/api/runs/run1", json={"notes": "before", "tags": ["a"]}).is_success
    r = client.patch("/api/runs/run1", json=body)
    assert r.status_code == 400 and says in r.json()["detail"]
    assert listed(client) == {"run1": ("before", ["a"])}
    assert client.patch("/api/runs/nope", json={"tags": ["a"]}).status_code == 404


def test_a_schema_3_database_migrates_with_empty_notes_and_tags(settings: Settings) -> None:
    with TestClient(create_app(settings)) as client:
        ingest(client, synth.records(steps=30))
        ingest(client, synth.records(run="run2", steps=10), run="run2")
    conn = sqlite3.connect(settings.data_dir / db.DB_NAME)
    conn.execute("ALTER TABLE runs DROP COLUMN notes")
    conn.execute("ALTER TABLE runs DROP COLUMN tags")
    conn.execute("PRAGMA user_version=3")
    conn.commit()
    conn.close()
    with TestClient(create_app(settings)) as client:
        assert listed(client) == {"run1": ("", []), "run2": ("", [])}
        assert client.get("/api/runs/run1").json()["steps"] == 30
        r = client.patch("/api/runs/run2", json={"tags": ["short"]})
        assert r.status_code == 200 and r.json()["tags"] == ["short"]
    conn = sqlite3.connect(settings.data_dir / db.DB_NAME)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == db.SCHEMA_VERSION
    assert json.loads(conn.execute("SELECT tags FROM runs WHERE id='run2'").fetchone()[0]) \
        == ["short"]
    conn.close()
