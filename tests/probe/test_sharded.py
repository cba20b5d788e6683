"""FSDP2 (``fully_shard``), DTensor tensor parallel and DDP through the real command line: two
gloo ranks on CPU, ``torchrun -m gradwatch run --step-log run.jsonl -- sharded_loops.py``
(streaming to a server too: ``tests/probe/sharded_launch.py``), then ``gradwatch check
run.rank*.jsonl``. The scenarios (``tests/probe/sharded_loops.py``) run in one launch; the
same launch without the probe is the differential test's other side.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from gradwatch.shardnorms import ModelNorms
from gradwatch.steplog import read_log
from gradwatch.verdict import verdict_of_logs
from gradwatch.wire import OptimizerInfo, Step
from tests.probe.sharded_launch import Launches
from tests.probe.sharded_loops import STEPS, Scenario, scenarios
from tests.probe.test_torchrun import _env

RANKS = (0, 1)
# The launches (tests/probe/sharded_launch.py) take about a minute: one worker makes them,
# once, for every test here and tests/e2e/test_sharded_server.py.
pytestmark = pytest.mark.xdist_group("sharded")


@pytest.fixture
def launches(sharded_launches: Launches) -> dict[str, Path]:
    return {"probe": sharded_launches.probe, "plain": sharded_launches.plain}


def _expected(sc: Scenario, rank: int) -> list[tuple[str, int]]:
    """The findings of a scenario on a rank: ``(kind, first step)``."""
    if sc.bug == "missed_r1":
        return [("missed_reset", 2)] if rank == 1 else []
    if sc.bug == "late":
        return [("late_reset", 0)]
    if sc.bug == "discarded" and not sc.nosync:
        # FSDP2 with sync off keeps the micro-batches in its unsharded gradient, which no
        # reset touches: nothing is lost.
        return [("discarded_accumulation", 0)]
    return []


def _by_scenario(log_path: Path) -> dict[str, str]:
    """Optimizer label (as findings name it) -> ``mode:scenario``."""
    infos = [r for r in read_log(log_path).records if isinstance(r, OptimizerInfo)]
    names = [f"{mode}:{sc.name}" for mode, sc in scenarios()]
    assert len(infos) == len(names)
    return {(i.label or i.opt): name for i, name in zip(infos, names, strict=True)}


def test_every_scenario_judged_right_on_every_rank(launches: dict[str, Path]) -> None:
    out = launches["probe"]
    logs = [read_log(out / f"run.rank{r}.jsonl") for r in RANKS]
    found: dict[tuple[str, int], list[tuple[str, int]]] = {}
    for rank in RANKS:
        names = _by_scenario(out / f"run.rank{rank}.jsonl")
        for f in verdict_of_logs([logs[rank]]).findings():
            found.setdefault((names[f.optimizer], rank), []).append((f.kind, f.first_step))
    for mode, sc in scenarios():
        for rank in RANKS:
            assert sorted(found.get((f"{mode}:{sc.name}", rank), [])) == _expected(sc, rank), (
                mode, sc.name, rank)


def test_norms_are_each_ranks_local_shards(launches: dict[str, Path]) -> None:
    out = launches["probe"]
    for rank in RANKS:
        ref = torch.load(out / f"rank{rank}.pt", weights_only=False)["results"]
        steps = [r for r in read_log(out / f"run.rank{rank}.jsonl").records
                 if isinstance(r, Step)]
        opts = [r.opt for r in read_log(out / f"run.rank{rank}.jsonl").records
                if isinstance(r, OptimizerInfo)]
        for (mode, sc), opt in zip(scenarios(), opts, strict=True):
            mine = [s for s in steps if s.opt == opt]
            assert len(mine) == STEPS
            norms = ref[f"{mode}:{sc.name}"]["norms"]
            for s, want in zip(mine, norms, strict=True):
                if want is None:
                    assert s.norm is None or s.norm == 0.0, (sc.name, s.step)
                else:
                    assert s.norm == pytest.approx(want, rel=1e-5), (mode, sc.name, s.step)


def test_check_names_each_rank(launches: dict[str, Path]) -> None:
    out = launches["probe"]
    c = subprocess.run(["gradwatch", "check", "--json", "run.rank0.jsonl", "run.rank1.jsonl"],
                       cwd=out, env=_env(), capture_output=True, text=True, timeout=120)
    assert c.returncode == 1, c.stderr
    got = json.loads(c.stdout)
    ranks_of: dict[str, set[int]] = {}
    for f in got["findings"]:
        ranks_of.setdefault(f["kind"], set()).add(f["rank"])
    assert ranks_of == {"missed_reset": {1}, "late_reset": {0, 1},
                        "discarded_accumulation": {0, 1}}
    assert got["summary"]["nothing_judged"] is None


def test_the_probe_changes_nothing_the_training_computes(launches: dict[str, Path]) -> None:
    for rank in RANKS:
        a: dict[str, Any] = torch.load(launches["probe"] / f"rank{rank}.pt", weights_only=False)
        b: dict[str, Any] = torch.load(launches["plain"] / f"rank{rank}.pt", weights_only=False)
        assert torch.equal(a["rng"], b["rng"])
        assert a["results"].keys() == b["results"].keys()
        for name, x in a["results"].items():
            y = b["results"][name]
            assert len(x["params"]) == len(y["params"])
            for p, q in zip(x["params"], y["params"], strict=True):
                assert p.dtype == q.dtype and torch.equal(p, q), (rank, name)
            assert all(torch.equal(u, v) for u, v in zip(x["losses"], y["losses"],
                                                         strict=True)), (rank, name)
            assert x["norms"] == y["norms"], (rank, name)


def test_ranks_norms_combine_by_placement_into_the_models(launches: dict[str, Path]) -> None:
    out = launches["probe"]
    logs = [read_log(out / f"run.rank{r}.jsonl") for r in RANKS]
    placements = [r.placements for r in logs[0].records if isinstance(r, OptimizerInfo)]
    kinds = dict(zip([f"{m}:{sc.name}" for m, sc in scenarios()], placements, strict=True))
    assert kinds["fsdp:clean"] == "ssss"  # every FSDP2 parameter sharded
    assert kinds["tp:clean_sgd"] == "sssr"  # RowwiseParallel's bias replicated
    assert kinds["ddp:clean_ddp"] is None
    combined: dict[tuple[str, int], float | None] = {}
    model = ModelNorms(2)
    real = model._combined

    def keep(opt: str, step: int, parts: Any) -> None:
        real(opt, step, parts)
        combined[(opt, step)] = model.last["norm"] if model.last else None

    model._combined = keep  # type: ignore[method-assign]
    for rank, log in zip(RANKS, logs, strict=True):
        for r in log.records:
            model.feed(r, rank)
    ref = torch.load(out / "rank0.pt", weights_only=False)["results"]
    opts = [r.opt for r in logs[0].records if isinstance(r, OptimizerInfo)]
    checked = 0
    for (mode, sc), opt in zip(scenarios(), opts, strict=True):
        if mode == "ddp":
            continue
        for step, want in enumerate(ref[f"{mode}:{sc.name}"]["full"]):
            got = combined.get((opt, step))
            if want is None:  # no gradient at all (a late reset): none, or zeros
                assert got in (None, 0.0)
            else:
                assert got == pytest.approx(want, rel=1e-5), (mode, sc.name, step)
                checked += 1
    assert checked > 100
    c = subprocess.run(["gradwatch", "check", "--json", "run.rank0.jsonl", "run.rank1.jsonl"],
                       cwd=out, env=_env(), capture_output=True, text=True, timeout=120)
    summary = json.loads(c.stdout)["summary"]["model_norms"]
    last = ref["tp:discarded_sgd"]["full"][-1]
    assert summary["ranks"] == 2 and summary["steps"] == len(combined)
    assert summary["last"]["norm"] == pytest.approx(last, rel=1e-5)
    t = subprocess.run(["gradwatch", "check", "run.rank0.jsonl", "run.rank1.jsonl"],
                       cwd=out, env=_env(), capture_output=True, text=True, timeout=120)
    assert "model gradient norms, 2 ranks combined by placement" in t.stdout

