"""End to end: the lifecycle records and the virtual optimizer ``manual`` stream to a real
server process, which reports the findings ``gradwatch check`` reports."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.serverproc import ServerProc

torch = pytest.importorskip("torch")
import gradwatch  # noqa: E402
from gradwatch.steplog import read_log  # noqa: E402
from gradwatch.verdict import verdict_of  # noqa: E402


def test_untrained_head_and_manual_updates_reach_the_server(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model[2] = torch.nn.Linear(8, 1)  # replaced after the optimizer was built
    scale = torch.ones(1, requires_grad=True)  # updated by hand, its reset forgotten
    with ServerProc(tmp_path / "data") as srv:
        with gradwatch.watch(opt, model=model, log=tmp_path / "run.jsonl", server=srv.ws,
                             run_id="e2e-life"):
            for _ in range(30):
                opt.zero_grad()
                (model(torch.randn(4, 4)) * scale).pow(2).mean().backward()
                opt.step()
                with torch.no_grad():
                    scale -= 0.01 * scale.grad
        log = read_log(tmp_path / "run.jsonl")
        want = [f.model_dump(mode="json")
                for f in verdict_of([log.header, *log.records]).findings()]
        assert {(f["kind"], f["optimizer"]) for f in want} == {
            ("untrained_params", "(no optimizer)"), ("missed_reset", "manual")}
        deadline = time.monotonic() + 15
        while srv.get("/api/runs/e2e-life/findings")["findings"] != want:
            assert time.monotonic() < deadline, srv.get("/api/runs/e2e-life/findings")
            time.sleep(0.1)
        steps = srv.get("/api/runs/e2e-life/steps?max_points=100000")
        assert "manual" in set(steps["opt"]) and "SGD#0" in set(steps["opt"])
