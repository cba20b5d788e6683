"""The probe changes nothing the training computes: the project's test loops (clean and
buggy, on one process; the 2-rank FSDP2, TP and DDP ones are in ``test_sharded``), run with
and without ``gradwatch.watch``, end with the same parameters and losses bit for bit and the
same RNG state."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import gradwatch
from tests.probe import deliberate_loops as d
from tests.probe.probe_helpers import loss_of, mlp

STEPS = 8


def _plain(kind: str) -> Callable[[], tuple[torch.nn.Module, Any, Callable[[], list[Any]]]]:
    """A loop of the probe tests' bug kinds over :func:`mlp` (``kind``: clean, missed, late,
    discarded, discarded_none, accumulate, keep)."""

    def make() -> tuple[torch.nn.Module, Any, Callable[[], list[Any]]]:
        model = mlp()
        opt = torch.optim.Adam(model.parameters(), lr=0.01)

        def loop() -> list[Any]:
            losses = []
            for i in range(STEPS):
                if kind in ("clean", "accumulate") or (kind == "missed" and i < 3):
                    opt.zero_grad()
                if kind == "keep":
                    opt.zero_grad(set_to_none=False)
                for j in range(2 if kind != "clean" else 1):
                    if j == 1 and kind == "discarded":
                        opt.zero_grad()
                    if j == 1 and kind == "discarded_none":
                        for p in model.parameters():
                            p.grad = None
                    loss = loss_of(model, 2 * i + j) * (1 + torch.rand(()))  # the global RNG
                    loss.backward()
                    losses.append(loss.detach())
                if kind == "late":
                    model.zero_grad()
                opt.step()
            return losses

        return model, opt, loop

    return make


def _deliberate(which: str) -> Callable[[], tuple[torch.nn.Module, Any, Callable[[], Any]]]:
    def make() -> tuple[torch.nn.Module, Any, Callable[[], Any]]:
        model = d.classifier()
        if which == "sam":
            sam = d.SAM(model.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9)
            return model, sam, lambda: d.sam_two_steps(model, sam, STEPS)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loop = d.train_fgsm if which == "fgsm" else d.train_pgd
        return model, opt, lambda: loop(model, opt, STEPS)

    return make


LOOPS = {**{k: _plain(k) for k in ("clean", "missed", "late", "discarded", "discarded_none",
                                    "accumulate", "keep")},
         **{k: _deliberate(k) for k in ("sam", "fgsm", "pgd")}}


def _train(make: Callable[[], Any], log: Path | None) -> tuple[list[Any], Any, Any, Any]:
    torch.manual_seed(0)
    random.seed(0)
    model, opt, loop = make()
    if log is None:
        losses = loop()
    else:
        with gradwatch.watch(opt, log=log):
            losses = loop()
    params = [p.detach().clone() for p in model.parameters()]
    return params, losses, torch.get_rng_state(), random.getstate()


@pytest.mark.parametrize("name", list(LOOPS))
def test_the_probe_changes_nothing_the_training_computes(tmp_path: Path, name: str) -> None:
    watched = _train(LOOPS[name], tmp_path / "run.jsonl")
    plain = _train(LOOPS[name], None)
    assert (tmp_path / "run.jsonl").stat().st_size > 0
    for p, q in zip(watched[0], plain[0], strict=True):
        assert p.dtype == q.dtype and torch.equal(p, q)
    if watched[1] is not None:
        assert len(watched[1]) == len(plain[1])
        assert all(torch.equal(a, b) for a, b in zip(watched[1], plain[1], strict=True))
    assert torch.equal(watched[2], plain[2])
    assert watched[3] == plain[3]
