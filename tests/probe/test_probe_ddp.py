"""DistributedDataParallel on CPU (gloo, two real processes): DDP averages gradients in
place after the hooks run, and with ``gradient_as_bucket_view=True`` every ``.grad`` is a
view of one bucket sharing its version counter. Neither may look like a reset, and on steps
that re-apply old gradients the fresh norm and drift match a slow reference taken around
each backward (``fresh_reference``)."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import gradwatch
from gradwatch.steplog import read_log
from gradwatch.verdict import verdict_of
from gradwatch.wire import Step
from tests.probe.fresh_reference import FreshReference

CASES = ("clean", "accumulate", "missed", "missed_clipped")
STEPS = 6


def _worker(rank: int, world: int, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world))
    # A file rendezvous: no port picked in advance that another process could take first.
    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous", rank=rank,
                            world_size=world)
    try:
        for bucket_view in (False, True):
            for case in CASES:
                torch.manual_seed(0)
                model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(),
                                            torch.nn.Linear(8, 2))
                ddp = torch.nn.parallel.DistributedDataParallel(
                    model, gradient_as_bucket_view=bucket_view)
                opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
                gen = torch.Generator().manual_seed(rank)
                micro = 3 if case == "accumulate" else 1
                ref = FreshReference(list(model.parameters()))
                name = f"{out}/{case}-{int(bucket_view)}"
                with gradwatch.watch(opt, log=f"{name}.jsonl"):
                    for i in range(STEPS):
                        if not case.startswith("missed") or i < 3:
                            opt.zero_grad()
                            ref.reset()
                        for j in range(micro):
                            x = torch.randn(16, 4, generator=gen)
                            y = torch.randn(16, 2, generator=gen)
                            if j < micro - 1:
                                with ddp.no_sync():
                                    ref.backward(((ddp(x) - y) ** 2).mean())
                            else:
                                ref.backward(((ddp(x) - y) ** 2).mean())
                        if case == "missed_clipped":
                            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
                        ref.read()
                        opt.step()
                with open(f"{name}.rank{rank}.ref.json", "w") as f:
                    json.dump([asdict(row) for row in ref.rows], f)
    finally:
        dist.destroy_process_group()
    # Every log is closed by now. Leave without the interpreter's teardown: gloo's threads
    # sometimes abort it ("terminate called without an active exception"), which would
    # fail a run whose logs are complete.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# The module's tests read one two-rank run: one worker makes it once (xdist: loadgroup;
# session scope, as a module fixture is made again when the worker interleaves modules).
pytestmark = pytest.mark.xdist_group("ddp")


@pytest.fixture(scope="session")
def ddp_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ddp")
    mp.spawn(_worker, args=(2, str(out)), nprocs=2)
    return out


@pytest.mark.parametrize("bucket_view", [0, 1])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("rank", [0, 1])
def test_ddp(ddp_logs: Path, case: str, bucket_view: int, rank: int) -> None:
    log = read_log(ddp_logs / f"{case}-{bucket_view}.rank{rank}.jsonl")
    assert log.header.rank == rank and log.header.world_size == 2
    steps = [r for r in log.records if isinstance(r, Step)]
    found = verdict_of([log.header, *log.records]).findings()
    kinds = [(f.kind, f.first_step, f.steps) for f in found]
    assert len(steps) == STEPS
    assert all(not r.params for s in steps for r in s.resets if r.how != "optimizer_zero_grad")
    rows = json.loads((ddp_logs / f"{case}-{bucket_view}.rank{rank}.ref.json").read_text())
    for s, row in zip(steps, rows, strict=True):  # DDP averaged in place before each step
        assert s.norm == pytest.approx(row["norm"], rel=1e-5)
        assert s.fresh_norm == pytest.approx(row["fresh_norm"], rel=1e-4)
        assert s.drift == pytest.approx(row["drift"], rel=1e-4)
        assert s.drift == pytest.approx(row["at_backward"], rel=1e-4)
    if case.startswith("missed"):  # zero_grad stops after step 2: all re-applied from 3
        assert kinds == [("missed_reset", 3, 3)]
        assert [s.stale_params for s in steps[3:]] == [[0, 1, 2, 3]] * 3
        assert [s.stale for s in steps[3:]] == [4, 8, 12]
        assert all(s.drift != pytest.approx(1.0) for s in steps[3:])
    else:
        assert kinds == []
        assert [s.fresh for s in steps] == [4 * (3 if case == "accumulate" else 1)] * STEPS
        assert all(s.drift == pytest.approx(1.0) for s in steps)
