"""A probe that turns itself off says so everywhere: the step log records the cause and the
last judged step, ``gradwatch check`` exits 3 naming the rank, the step and the cause (never
"0 findings" and 0), the ``run`` verdict and the handle say it, and training goes on."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import torch

import gradwatch
from gradwatch.probe.ledger import Ledger
from gradwatch.steplog import read_log
from gradwatch.verdict import verdict_of_logs
from gradwatch.wire import Stats, Step
from tests.probe.probe_helpers import loss_of, mlp
from tests.probe.test_probe_cli import _run

BREAKS = textwrap.dedent('''
    import torch
    from gradwatch.probe.ledger import Ledger

    real = Ledger.plain_step

    def breaks(self):  # the probe fails inside the step hook from step 3 on
        if self.step == 3:
            raise RuntimeError("index_put_ got mixed torch.Tensor and DTensor")
        return real(self)

    Ledger.plain_step = breaks
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i in range(6):
        opt.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()
    print("trained", float(model.weight.sum()))
''')


def test_a_stopped_probe_is_in_the_log_and_check_exits_3(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(BREAKS)
    r = _run(["run", "--log", "run.jsonl", "--", "train.py"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "trained" in r.stdout  # training went on to its end
    assert ("nothing judged after step 2 of opt: the probe turned itself off "
            "(RuntimeError: index_put_ got mixed torch.Tensor and DTensor)") in r.stderr
    assert "no gradient-reset bug found" not in r.stderr
    log = read_log(tmp_path / "run.jsonl")
    stops = [s for s in log.records if isinstance(s, Stats) and s.disabled]
    assert stops and (stops[0].last_step, stops[0].last_opt) == (2, "SGD#0")
    assert [s.step for s in log.records if isinstance(s, Step)] == [0, 1, 2]
    c = _run(["check", "run.jsonl"], tmp_path)
    assert c.returncode == 3, c.stdout + c.stderr
    assert "0 findings" not in c.stdout
    assert "nothing judged after step 2 of opt: the probe turned itself off" in c.stdout
    assert "nothing judged after step 2 of opt" in c.stderr
    j = _run(["check", "--json", "run.jsonl"], tmp_path)
    assert j.returncode == 3
    assert json.loads(j.stdout)["summary"]["stopped"] == [{
        "rank": 0, "worker": None, "opt": "opt", "after_step": 2,
        "cause": "RuntimeError: index_put_ got mixed torch.Tensor and DTensor"}]


def _log(path: Path, rank: int, stop_at: int | None) -> None:
    """Rank ``rank``'s log of a two-rank run, its probe broken at step ``stop_at``."""
    real = Ledger.plain_step

    def breaks(self: Ledger) -> object:
        if self.step == stop_at:
            raise ValueError("boom")
        return real(self)

    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    try:
        Ledger.plain_step = breaks  # type: ignore[method-assign]
        with gradwatch.watch(opt, log=path, run_id="two") as h:
            for i in range(4):
                opt.zero_grad()
                loss_of(model, i).backward()
                opt.step()
    finally:
        Ledger.plain_step = real  # type: ignore[method-assign]
    assert h.stopped() == (None if stop_at is None else (
        f"nothing judged after step {stop_at - 1} of opt: the probe turned itself off "
        "(ValueError: boom)"))
    lines = path.read_text().splitlines()  # one process here: its header says which rank
    head = json.loads(lines[0])
    head["rank"], head["world_size"] = rank, 2
    path.write_text("\n".join([json.dumps(head), *lines[1:]]) + "\n")


def test_check_names_the_rank_whose_probe_stopped(tmp_path: Path) -> None:
    _log(tmp_path / "r0.jsonl", 0, None)
    _log(tmp_path / "r1.jsonl", 1, 1)
    logs = [read_log(tmp_path / "r0.jsonl"), read_log(tmp_path / "r1.jsonl")]
    assert verdict_of_logs(logs).stopped_text() == (
        "nothing judged after step 0 of opt on rank 1: the probe turned itself off "
        "(ValueError: boom)")
    c = _run(["check", "r0.jsonl", "r1.jsonl"], tmp_path)
    assert c.returncode == 3, c.stdout + c.stderr
    assert "on rank 1: the probe turned itself off (ValueError: boom)" in c.stderr
    assert "0 findings" not in c.stdout


def test_a_version_3_log_places_the_stop_at_its_latest_step(tmp_path: Path) -> None:
    lines = [
        '{"seq":0,"t":1.0,"type":"header","v":3,"run":"old","run_name":"old",'
        '"torch_version":"2","gradwatch_version":"0","started":1.0}',
        '{"seq":1,"t":1.0,"type":"optimizer","opt":"SGD#0","cls":"SGD","params":["w"]}',
        '{"seq":2,"t":1.0,"type":"step","opt":"SGD#0","step":0,"consumed":1}',
        '{"seq":3,"t":1.0,"type":"step","opt":"SGD#0","step":1,"consumed":1}',
        '{"seq":4,"t":1.0,"type":"stats","disabled":"TypeError: x"}',
        '{"seq":5,"t":1.0,"type":"end","steps":2}',
    ]
    (tmp_path / "old.jsonl").write_text("\n".join(lines) + "\n")
    c = _run(["check", "old.jsonl"], tmp_path)
    assert c.returncode == 3
    assert ("nothing judged after step 1 of SGD#0: the probe turned itself off (TypeError: x)"
            in c.stderr)
