"""Resets by hand before an optimizer's first step are judged like any later one (the ledger
is armed from attach), and an optimizer that is not used yet is watched for a bounded number
of backwards only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import gradwatch
from tests.probe.probe_helpers import loss_of, mlp

STEPS = 5


@pytest.mark.parametrize("where", ["between_micro_batches", "before_step"])
def test_a_hand_reset_is_flagged_from_step_0(watched: Any, where: str) -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def loop() -> None:
        for i in range(STEPS):
            for j in range(2):
                if where == "between_micro_batches" and j == 1:
                    for p in model.parameters():
                        p.grad = None
                loss_of(model, 2 * i + j).backward()
            if where == "before_step":
                for p in model.parameters():
                    p.grad = None
            opt.step()

    kind = "discarded_accumulation" if where == "between_micro_batches" else "late_reset"
    assert watched(opt, loop).kinds() == [(kind, "SGD#0", 0, STEPS)]


def test_an_optimizer_not_used_yet_is_watched_a_bounded_number_of_backwards(
        tmp_path: Path) -> None:
    model = mlp()
    later = torch.optim.SGD(torch.nn.Linear(3, 3).parameters(), lr=0.1)  # never steps
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with gradwatch.watch([opt, later], log=tmp_path / "run.jsonl") as h:
        led = h.tracker.ledgers[later]
        held = []
        for i in range(200):
            opt.zero_grad()
            loss_of(model, i).backward()
            opt.step()
            held.append(len(led.contents.hand.backwards))
    assert max(held) <= 64 and held[-1] == 0
    assert h.findings() == []
