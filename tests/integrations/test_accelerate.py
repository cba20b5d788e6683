"""Accelerate: the README's two-line attach after ``accelerator.prepare(...)``, on a real
``Accelerator`` with ``accumulate()`` (CPU): a clean loop with clipping stays clean with
every real step judged; a zero_grad that bypasses the accumulation gate is caught."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

accelerate = pytest.importorskip("accelerate")

import torch  # noqa: E402

import gradwatch  # noqa: E402
from gradwatch.steplog import read_log  # noqa: E402
from gradwatch.wire import Step  # noqa: E402
from tests.integrations.conftest import judged, kinds  # noqa: E402

BATCHES, ACCUMULATE = 16, 4


@pytest.fixture(autouse=True)
def _fresh_accelerator_state() -> Iterator[None]:
    yield
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def train(log: Path, bypass_gate: bool = False) -> None:
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=ACCUMULATE)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(BATCHES * 4, 6), torch.randn(BATCHES * 4, 1)),
        batch_size=4)
    model, optimizer, data = accelerator.prepare(
        model, torch.optim.AdamW(model.parameters(), lr=1e-3), data)
    # The README's attach: the AcceleratedOptimizer is unwrapped to the optimizer it gates.
    with gradwatch.watch(optimizer, model=model, log=log):
        for x, y in data:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()  # gated: steps once per window
                if bypass_gate:
                    optimizer.optimizer.zero_grad()  # clears every micro-batch
                else:
                    optimizer.zero_grad()  # gated like step


def test_accumulate_with_clipping_is_clean_and_every_real_step_is_judged(
        tmp_path: Path) -> None:
    log = tmp_path / "acc.jsonl"
    train(log)
    v = judged(log)
    assert v.findings() == []
    steps = [r for r in read_log(log).records if isinstance(r, Step)]
    assert len(steps) == BATCHES // ACCUMULATE
    assert [s.backwards for s in steps] == [ACCUMULATE] * len(steps)


def test_a_zero_grad_past_the_accumulation_gate_is_caught(tmp_path: Path) -> None:
    log = tmp_path / "acc.jsonl"
    train(log, bypass_gate=True)
    # named as train() holds the prepared optimizer when it watches it
    assert ("discarded_accumulation", "optimizer") in kinds(judged(log))
