"""Failover: a run streams to ``ws://A,ws://B``, two servers on one PostgreSQL; server A
is killed (-9) mid-run and the probe moves to B, which resumes the stream where the
database says: nothing lost, nothing stored twice, the verdict whole."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_streaming import make_model, stored_steps, train

from tests.serverproc import ServerProc

pytest.importorskip("torch")
import gradwatch  # noqa: E402
from gradwatch.steplog import read_log  # noqa: E402
from gradwatch.verdict import verdict_of  # noqa: E402


def test_kill9_of_a_server_mid_run_moves_to_the_next_and_loses_nothing(
        tmp_path: Path, pg_cluster: Any) -> None:
    url = pg_cluster.new_database()
    a = ServerProc(tmp_path / "a", None, "--db", url).start()
    b = ServerProc(tmp_path / "b", None, "--db", url).start()
    seen_on_a: list[int] = []

    def chaos(i: int) -> None:
        if i == 300:
            seen_on_a.extend(stored_steps(a, "e2e-failover"))
            a.kill9()

    model, opt = make_model()
    try:
        with gradwatch.watch(opt, model=model, log=tmp_path / "run.jsonl",
                             server=f"{a.ws},{b.ws}", run_id="e2e-failover") as h:
            train(model, opt, range(700), forget_from=500, pause=0.001, hook=chaos)
        stats = h.streamer.stats()
        assert stats["backlog_bytes"] == 0 and stats["reconnects"] >= 1, stats
        assert seen_on_a, "server A stored nothing before it was killed"
        log = read_log(tmp_path / "run.jsonl")
        sent = [r.step for r in log.records if r.type == "step"]
        assert sent == list(range(700))
        assert stored_steps(b, "e2e-failover") == sent  # each step once
        run = b.get("/api/runs/e2e-failover")
        assert run["steps"] == 700 and run["status"] == "finished"
        want = [f.model_dump(mode="json")
                for f in verdict_of([log.header, *log.records]).findings()]
        assert b.get("/api/runs/e2e-failover/findings")["findings"] == want
        assert [(f["kind"], f["first_step"]) for f in want] == [("missed_reset", 500)]
    finally:
        a.kill9()
        b.stop()
