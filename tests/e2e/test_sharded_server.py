"""FSDP2 and tensor parallel through the real command line into a real server: two gloo ranks
of ``torchrun -m gradwatch run --server ...`` stream into one run, and the server's step rows
carry the model's gradient norms (the script's own norms of the gathered full gradients) by
default and each rank's shard norms with ``norms=rank``. The launch is the one
``tests/probe/test_sharded.py`` judges (``tests/probe/sharded_launch.py``)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.probe.sharded_launch import Launches
from tests.probe.sharded_loops import STEPS, scenarios

# The launch (tests/probe/sharded_launch.py) is the one tests/probe/test_sharded.py reads:
# one worker makes it, once, for both.
pytestmark = pytest.mark.xdist_group("sharded")


def _by_step(ss: dict[str, Any], rank: int, opt: str) -> dict[int, Any]:
    return {s: n for r, o, s, n in zip(ss["rank"], ss["opt"], ss["step"], ss["norm"],
                                       strict=True) if r == rank and o == opt}


def test_a_sharded_launch_shows_the_models_norms(sharded_launches: Launches) -> None:
    out = sharded_launches.probe
    run, model, own = sharded_launches.run, sharded_launches.model, sharded_launches.own
    assert run["ranks"] == [0, 1] and run["status"] == "finished"
    # in the order the script made them (the k-th optimizer is the k-th scenario)
    opts = sorted((o["opt"] for o in run["optimizers"] if o["rank"] == 0),
                  key=lambda o: int(o.rpartition("#")[2]))
    ref = [torch.load(out / f"rank{k}.pt", weights_only=False)["results"] for k in (0, 1)]
    checked = 0
    for (mode, sc), opt in zip(scenarios(), opts, strict=True):
        name = f"{mode}:{sc.name}"
        for rank in (0, 1):
            got, mine = _by_step(model, rank, opt), _by_step(own, rank, opt)
            assert sorted(got) == sorted(mine) == list(range(STEPS)), (name, rank)
            for step in range(STEPS):
                local = ref[rank][name]["norms"][step]
                assert mine[step] in (None, 0.0) if local is None else \
                    mine[step] == pytest.approx(local, rel=1e-5), (name, rank, step)
                if mode == "ddp":  # nothing sharded: each rank's own
                    assert got[step] == mine[step]
                    continue
                # a replicated parameter counts once, rank 0's: where the ranks disagree
                # (rank 1 missed a reset) the model's norm is rank 0's gathered one
                full = ref[0][name]["full"][step]
                if full is None:  # no gradient at all (a late reset): none, or zeros
                    assert got[step] in (None, 0.0)
                else:
                    assert got[step] == pytest.approx(full, rel=1e-5), (name, rank, step)
                    checked += 1
    assert checked > 200
