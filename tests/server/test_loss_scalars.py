"""Each step's loss and learning rates, and the values a user logs, through the routes: stored,
served in the step series and ``GET .../scalars``, and carried by live frames."""

from __future__ import annotations

import math

import synth
from fastapi.testclient import TestClient

from gradwatch.wire import Scalars


def records_with_loss(steps: int = 30) -> list:
    recs = synth.records(steps=steps, end=False)
    for r in recs:
        if r.type == "step":
            r.loss = math.nan if r.step == 7 else 2.0 / (1 + r.step)
            r.lr = [0.1 / (1 + r.step // 10), 0.01]
    recs.append(Scalars(seq=len(recs), t=1001.0, step=5, opt="SGD#0",
                        values={"acc": 0.5, "val_loss": math.inf}))
    recs.append(Scalars(seq=len(recs), t=1002.0, step=9, values={"acc": 0.75}))
    return recs


def ingest(client: TestClient, recs: list, run: str = "run1") -> None:
    with client.websocket_connect("/ws/ingest") as ws:
        for frame in synth.batches(recs, run):
            ws.send_text(frame)
            ws.receive_json()


def test_loss_and_lr_are_stored_and_served_with_the_steps(client: TestClient) -> None:
    ingest(client, records_with_loss())
    s = client.get("/api/runs/run1/steps").json()
    want = [2.0 / (1 + i) for i in range(30)]
    assert s["loss"][:7] == want[:7] and s["loss"][8:] == want[8:]
    assert s["loss"][7] == "NaN"  # NaN is data, kept apart from "unknown"
    assert s["lr"][0] == [0.1, 0.01] and s["lr"][25] == [0.1 / 3, 0.01]


def test_scalars_route_and_live_frames(client: TestClient) -> None:
    recs = records_with_loss()
    ingest(client, recs[:3])  # the run exists: the live view opens on it
    with client.websocket_connect("/ws/live?run=run1") as live:
        assert live.receive_json()["type"] == "snapshot"
        ingest(client, recs)
        got_scalars, got_loss = [], []
        while len(got_scalars) < 3:
            frame = live.receive_json()
            if frame["type"] == "scalars":
                sc = frame["scalars"]
                got_scalars += list(zip(sc["step"], sc["name"], sc["value"], strict=True))
            elif frame["type"] == "steps":
                got_loss += frame["steps"]["loss"]
    assert got_scalars == [(5, "acc", 0.5), (5, "val_loss", "Infinity"), (9, "acc", 0.75)]
    assert got_loss[:3] == [2.0 / (1 + i) for i in range(1, 4)]  # after the snapshot's step
    sc = client.get("/api/runs/run1/scalars").json()
    assert sc["name"] == ["acc", "val_loss", "acc"] and sc["step"] == [5, 5, 9]
    assert sc["opt"] == ["SGD#0", "SGD#0", None] and sc["total"] == 3
    assert client.get("/api/runs/nope/scalars").status_code == 404


def test_old_runs_without_loss_read_as_unknown(client: TestClient) -> None:
    ingest(client, synth.records(steps=5))
    s = client.get("/api/runs/run1/steps").json()
    assert s["loss"] == [None] * 5 and s["lr"] == [None] * 5
    assert client.get("/api/runs/run1/scalars").json()["name"] == []
