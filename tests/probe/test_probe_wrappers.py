"""Wrappers that gate step and zero_grad: HF Accelerate (real) and Lightning's pattern."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.probe.probe_helpers import loss_of, mlp


def test_accelerate_accumulation_is_clean(watched: Any) -> None:
    accelerate = pytest.importorskip("accelerate")
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=2)
    m = mlp()
    model, opt = accelerator.prepare(m, torch.optim.SGD(m.parameters(), lr=0.01))
    assert type(opt).__name__ == "AcceleratedOptimizer"

    def loop() -> None:
        for i in range(6):
            with accelerator.accumulate(model):
                accelerator.backward(loss_of(model, i))
                opt.step()  # gated: the inner step runs every 2nd batch
                opt.zero_grad()  # gated the same way

    r = watched(opt, loop, model=m)  # the wrapper is unwrapped to the real optimizer
    assert r.findings == []
    assert [s.backwards for s in r.steps()] == [2, 2, 2]
    assert [s.fresh for s in r.steps()] == [8, 8, 8]


class LightningStyleOptimizer:
    """Lightning's LightningOptimizer gating, re-implemented: it holds ``_optimizer`` and
    steps it with a closure that runs training_step, zero_grad (first batch of a window
    only) and backward; on the other batches of a window Lightning calls the closure
    without stepping."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self._optimizer = optimizer

    def step(self, closure: Any) -> Any:
        return self._optimizer.step(closure=closure)

    def zero_grad(self) -> None:
        self._optimizer.zero_grad()


@pytest.mark.parametrize("accumulate", [1, 3])
def test_lightning_style_gating_is_clean(watched: Any, accumulate: int) -> None:
    m = mlp()
    lopt = LightningStyleOptimizer(torch.optim.Adam(m.parameters(), lr=0.01))

    def loop() -> None:
        for batch_idx in range(6):
            first = batch_idx % accumulate == 0
            last = (batch_idx + 1) % accumulate == 0

            def closure(batch_idx: int = batch_idx, first: bool = first) -> torch.Tensor:
                loss = loss_of(m, batch_idx) / accumulate
                if first:
                    lopt.zero_grad()
                loss.backward()
                return loss

            if last:
                lopt.step(closure=closure)
            else:
                closure()

    r = watched(lopt, loop, model=m)
    assert r.findings == []
    assert [s.backwards for s in r.steps()] == [accumulate] * (6 // accumulate)


@pytest.mark.parametrize("bug", [False, True])
def test_compiled_step_keeps_the_hook_out_of_the_graph(watched: Any, bug: bool) -> None:
    """``torch.compile`` of a function that steps: the step hook graph-breaks, is not
    traced, and still judges every step (Dynamo only, backend "eager": no C++ compiler)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    @torch.compile(backend="eager")
    def step() -> None:
        opt.step()

    def loop() -> None:
        for i in range(6):
            if not (bug and i >= 3):
                opt.zero_grad()
            loss_of(model, i).backward()
            step()

    try:
        res = watched(opt, loop)
        breaks = list(counters["graph_break"])
    finally:
        torch._dynamo.reset()
    assert any("gradwatch's optimizer step hook" in b for b in breaks), breaks
    steps = res.steps()
    assert [s.step for s in steps] == list(range(6))
    assert [s.fresh for s in steps] == [4] * 6  # 4 parameters, one backward per step
    if bug:
        assert res.kinds() == [("missed_reset", "SGD#0", 3, 3)]
    else:
        assert res.kinds() == []
