"""DistributedDataParallel on CPU (gloo, two real processes): DDP averages gradients in
place after the hooks run, and with ``gradient_as_bucket_view=True`` every ``.grad`` is a
view of one bucket sharing its version counter. Neither may look like a reset."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import gradwatch
from gradwatch.steplog import read_log
from gradwatch.verdict import verdict_of
from gradwatch.wire import Step

CASES = ("clean", "accumulate", "missed")
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
                with gradwatch.watch(opt, log=f"{out}/{case}-{int(bucket_view)}.jsonl"):
                    for i in range(STEPS):
                        if case != "missed" or i < 3:
                            opt.zero_grad()
                        for j in range(micro):
                            x = torch.randn(16, 4, generator=gen)
                            y = torch.randn(16, 2, generator=gen)
                            if j < micro - 1:
                                with ddp.no_sync():
                                    ((ddp(x) - y) ** 2).mean().backward()
                            else:
                                ((ddp(x) - y) ** 2).mean().backward()
                        opt.step()
    finally:
        dist.destroy_process_group()
    # Every log is closed by now. Leave without the interpreter's teardown: gloo's threads
    # sometimes abort it ("terminate called without an active exception"), which would
    # fail a run whose logs are complete.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@pytest.fixture(scope="module")
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
    if case == "missed":  # zero_grad stops after step 2: every parameter re-applied from 3
        assert kinds == [("missed_reset", 3, 3)]
        assert [s.stale_params for s in steps[3:]] == [[0, 1, 2, 3]] * 3
        assert [s.stale for s in steps[3:]] == [4, 8, 12]
    else:
        assert kinds == []
        assert [s.fresh for s in steps] == [4 * (3 if case == "accumulate" else 1)] * STEPS
        assert all(s.drift == pytest.approx(1.0) for s in steps)
