"""Run names as the run list shows them: renaming, names kept distinct, and the CSV export
that carries the names of optimizers whatever characters they hold."""

from __future__ import annotations

import csv
import io

import pytest
import synth
from fastapi.testclient import TestClient

from gradwatch.server import Settings, create_app
from gradwatch.wire import IngestBatch


def ingest(client: TestClient, recs: list, run: str = "run1") -> None:
    with client.websocket_connect("/ws/ingest") as ws:
        for frame in synth.batches(recs, run, size=50):
            ws.send_text(frame)
            ws.receive_json()


def names(client: TestClient) -> dict[str, str]:
    return {r["id"]: r["name"] for r in client.get("/api/runs").json()["runs"]}


def test_a_rename_is_stored_kept_over_a_restart_and_sent_to_live_clients(
        settings: Settings) -> None:
    with TestClient(create_app(settings)) as client:
        ingest(client, synth.records(steps=20))
        with client.websocket_connect("/ws/live") as runs_ws, \
                client.websocket_connect("/ws/live?run=run1") as run_ws:
            assert runs_ws.receive_json()["type"] == "runs"
            assert run_ws.receive_json()["type"] == "snapshot"
            r = client.patch("/api/runs/run1", json={"name": "  baseline, lr 3e-4  "})
            assert r.status_code == 200 and r.json()["name"] == "baseline, lr 3e-4"
            for ws in (runs_ws, run_ws):
                frame = ws.receive_json()
                assert frame["type"] == "run" and frame["run"]["name"] == "baseline, lr 3e-4"
        assert client.get("/api/runs/run1").json()["name"] == "baseline, lr 3e-4"
    with TestClient(create_app(settings)) as client:
        assert names(client) == {"run1": "baseline, lr 3e-4"}


@pytest.mark.parametrize(("body", "status", "says"), [
    ({"name": "   "}, 400, "cannot be empty"),
    ({"name": "x" * 201}, 400, "at most 200 characters"),
    ({"name": "two\nlines"}, 400, "control characters"),
    ({"name": "other"}, 409, "already named 'other'"),
])
def test_a_bad_rename_says_why_and_changes_nothing(client: TestClient, body: dict,
                                                   status: int, says: str) -> None:
    ingest(client, synth.records(steps=5))
    ingest(client, synth.records(run="run2", steps=5), run="run2")
    assert client.patch("/api/runs/run2", json={"name": "other"}).status_code == 200
    r = client.patch("/api/runs/run1", json=body)
    assert r.status_code == status and says in r.json()["detail"]
    assert names(client) == {"run1": "run1", "run2": "other"}


def test_renaming_an_unknown_run_is_404_and_a_run_may_keep_its_own_name(
        client: TestClient) -> None:
    assert client.patch("/api/runs/nope", json={"name": "x"}).status_code == 404
    ingest(client, synth.records(steps=5))
    assert client.patch("/api/runs/run1", json={"name": "run1"}).status_code == 200


def test_runs_created_under_one_name_get_distinct_names(client: TestClient) -> None:
    for run in ("a", "b", "c"):
        recs = synth.records(run=run, steps=5)
        recs[0] = synth.header(run, name="buggy (replay)")
        ingest(client, recs, run=run)
    text = synth.log_text(synth.records(run="a", steps=5))
    assert client.post("/api/runs/import", content=text,
                       headers={"Content-Type": "application/x-ndjson"}).status_code == 201
    assert names(client) == {"a": "buggy (replay)", "b": "buggy (replay) (2)",
                             "c": "buggy (replay) (3)", "a-2": "a"}
    # a rename frees the name for the next run
    client.patch("/api/runs/a", json={"name": "first"})
    recs = synth.records(run="d", steps=5)
    recs[0] = synth.header("d", name="buggy (replay)")
    ingest(client, recs, run="d")
    assert names(client)["d"] == "buggy (replay)"


def test_the_csv_export_keeps_an_optimizer_name_with_quotes_and_commas_in_one_cell(
        client: TestClient) -> None:
    opt = 'G "main", v2'
    recs = synth.records(steps=12, stale_from=8, opt=opt)
    with client.websocket_connect("/ws/ingest") as ws:
        ws.send_text(IngestBatch(run="run1", records=recs).model_dump_json())
        ws.receive_json()
    r = client.get("/api/runs/run1/export?format=csv")
    assert r.status_code == 200
    rows = list(csv.reader(io.StringIO(r.text)))
    head, body = rows[0], rows[1:]
    assert head[:4] == ["rank", "opt", "step", "t"]
    assert len(body) == 12 and all(len(row) == len(head) for row in body)
    col = {name: i for i, name in enumerate(head)}
    assert [row[col["opt"]] for row in body] == [opt] * 12
    assert [int(row[col["step"]]) for row in body] == list(range(12))
    want = [s for s in recs if s.type == "step"]
    assert [float(row[col["norm"]]) for row in body] == pytest.approx([s.norm for s in want])
    assert [int(row[col["stale"]]) for row in body] == [s.stale for s in want]
    assert body[0][col["resets"]] == "optimizer_zero_grad:3" and body[-1][col["resets"]] == ""
