"""A sharded run's ranks stream into one run; the server shows the model's gradient norms
(combined across ranks by placement) by default and each rank's own on request: REST
``/steps?norms=``, the live snapshot and the live step frames."""

from __future__ import annotations

from typing import Any

import pytest
import sharded_synth as sh
from fastapi.testclient import TestClient
from test_routes import ingest

from gradwatch.server.modelnorms import model_steps
from gradwatch.server.reader import Reader

COMBINED = ("AdamW#0", "SGD#1")


def _rows(ss: dict[str, Any]) -> dict[tuple[int, str, int], dict[str, Any]]:
    cols = ("norm", "fresh_norm", "drift", "stale")
    return {(r, o, s): dict(zip(cols, vals, strict=True)) for r, o, s, *vals in zip(
        ss["rank"], ss["opt"], ss["step"], *(ss[c] for c in cols), strict=True)}


def _is_model(got: dict[tuple[int, str, int], dict[str, Any]], run: sh.ShardedRun) -> None:
    """Rows of sharded optimizers carry the reference model norms on every rank; the
    unsharded optimizer's rows and every finding fact are the rank's own."""
    assert len(got) == sum(1 for r in run.records.values() for x in r if x.type == "step")
    for (rank, opt, step), row in got.items():
        if opt == "AdamW#0" and step == sh.STEPS - 1:  # rank 1 never sent it
            assert (row["norm"], row["fresh_norm"], row["drift"]) == (None, None, None)
            continue
        want = run.model[(opt, step)] if opt in COMBINED else run.own[(rank, opt, step)]
        assert (row["norm"], row["fresh_norm"], row["drift"]) == pytest.approx(want, rel=1e-9), (
            rank, opt, step)
        assert row["stale"] == (3 if opt == "SGD#1" and rank == 1 and step >= 8 else 0)


def _is_own(got: dict[tuple[int, str, int], dict[str, Any]], run: sh.ShardedRun) -> None:
    assert set(got) == set(run.own)
    for key, row in got.items():
        assert (row["norm"], row["fresh_norm"], row["drift"]) == pytest.approx(
            run.own[key], rel=1e-9), key


@pytest.fixture
def run(client: TestClient) -> sh.ShardedRun:
    r = sh.sharded_run()
    for rank, recs in r.records.items():
        ingest(client, recs, sh.RUN, rank)
    return r


def test_steps_show_the_models_norms_and_each_ranks_on_request(
        client: TestClient, run: sh.ShardedRun) -> None:
    model = client.get(f"/api/runs/{sh.RUN}/steps").json()
    _is_model(_rows(model), run)
    # a rank's shard differs from the model's: the test would see rank 0's values
    assert run.own[(0, "SGD#1", 3)][0] < run.model[("SGD#1", 3)][0]
    _is_own(_rows(client.get(f"/api/runs/{sh.RUN}/steps?norms=rank").json()), run)
    one = client.get(f"/api/runs/{sh.RUN}/steps?rank=1&opt=SGD%231").json()
    assert one["total"] == sh.STEPS
    assert set(one["rank"]) == {1} and one["norm"][3] == pytest.approx(
        run.model[("SGD#1", 3)][0], rel=1e-9)
    assert client.get(f"/api/runs/{sh.RUN}/steps?norms=shard").status_code == 422
    views = {(o["rank"], o["opt"]): o["placements"]
             for o in client.get(f"/api/runs/{sh.RUN}").json()["optimizers"]}
    assert views[(1, "SGD#1")] == "ssr" and views[(0, "Adam#2")] is None


def test_a_downsampled_read_combines_aligned_steps(client: TestClient, run: sh.ShardedRun,
                                                   settings: Any) -> None:
    reader = Reader(settings.data_dir)
    try:
        got = model_steps(reader, sh.RUN, max_points=10)
    finally:
        reader.close()
    assert got is not None and got.downsampled
    for r in got.rows:
        if r.opt in COMBINED and r.norm is not None:
            assert r.norm == pytest.approx(run.model[(r.opt, r.step)][0], rel=1e-9)
    assert any(r.opt == "SGD#1" and r.rank == 1 and r.stale for r in got.rows)


def test_the_live_view_shows_the_models_norms_or_each_ranks(client: TestClient) -> None:
    run = sh.sharded_run()
    half = {rank: len(recs) // 2 for rank, recs in run.records.items()}
    for rank, recs in run.records.items():
        ingest(client, recs[:half[rank]], sh.RUN, rank)
    with client.websocket_connect(f"/ws/live?run={sh.RUN}") as ws, \
            client.websocket_connect(f"/ws/live?run={sh.RUN}&norms=rank") as raw:
        snaps = [ws.receive_json(), raw.receive_json()]
        assert [s["type"] for s in snaps] == ["snapshot", "snapshot"]
        for rank, recs in run.records.items():
            ingest(client, recs[half[rank]:], sh.RUN, rank)
        got = [_rows(s["steps"]) for s in snaps]
        n = len(run.own)
        for sock, rows in zip((ws, raw), got, strict=True):
            while len(rows) < n:
                m = sock.receive_json()
                if m["type"] == "steps":
                    new = _rows(m["steps"])
                    assert not set(new) & set(rows)  # no row sent twice
                    rows.update(new)
        _is_model(got[0], run)
        _is_own(got[1], run)


def test_after_a_restart_live_rows_resume_where_the_snapshot_stopped(
        settings: Any) -> None:
    """Rank 1 lags when the server restarts: the snapshot stops at rank 1's last step, and
    rank 0's steps stored past it before the restart still come live, combined."""
    from gradwatch.server import create_app

    run = sh.sharded_run()
    cut = {0: 2 * len(run.records[0]) // 3, 1: len(run.records[1]) // 3}
    with TestClient(create_app(settings)) as before:
        for rank, recs in run.records.items():
            ingest(before, recs[:cut[rank]], sh.RUN, rank)
    with TestClient(create_app(settings)) as after, \
            after.websocket_connect(f"/ws/live?run={sh.RUN}") as ws:
        snap = ws.receive_json()
        rows = _rows(snap["steps"])
        for rank, recs in run.records.items():
            ingest(after, recs[cut[rank]:], sh.RUN, rank)
        while len(rows) < len(run.own):
            m = ws.receive_json()
            if m["type"] == "steps":
                new = _rows(m["steps"])
                assert not set(new) & set(rows)
                rows.update(new)
        _is_model(rows, run)
