"""Where backward passes start: compiled training steps, the engine called directly, and
optimizers stepped inside the backward (the optimizer-in-backward pattern)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch

import gradwatch
from tests.probe.probe_helpers import loss_of, mlp


@pytest.mark.parametrize("bug", [False, True])
def test_compiled_train_step_marks_each_backward(watched: Any, bug: bool) -> None:
    """``torch.compile`` of forward, backward and step together: the backward wrapper is
    not traced, every backward is told apart (two per step here) and judged."""
    import torch._dynamo

    torch._dynamo.reset()
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    @torch.compile(backend="eager")
    def train_step(i: int) -> None:
        for j in range(2):
            loss_of(model, 2 * i + j).backward()
        opt.step()

    def loop() -> None:
        for i in range(4):
            if not (bug and i >= 2):
                opt.zero_grad()
            train_step(i)

    try:
        res = watched(opt, loop)
    finally:
        torch._dynamo.reset()
    steps = res.steps()
    assert [s.backwards for s in steps] == [2] * 4
    assert [s.fresh for s in steps] == [8] * 4
    assert res.kinds() == ([("missed_reset", "SGD#0", 2, 2)] if bug else [])


def _engine_backward(loss: torch.Tensor) -> None:
    """A backward the way Megatron's ``custom_backward`` runs it: the engine called
    directly, not through ``torch.autograd.backward``."""
    torch.autograd.Variable._execution_engine.run_backward(
        tensors=(loss,), grad_tensors=(torch.ones_like(loss),), keep_graph=False,
        create_graph=False, inputs=(), allow_unreachable=True, accumulate_grad=True)


@pytest.mark.parametrize("bug", [False, True])
def test_engine_called_directly_still_counts_and_judges(watched: Any, bug: bool) -> None:
    """Without a marker of its own such a backward joins the one before it: contributions
    are counted and judged; only ``backwards`` undercounts (documented)."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def loop() -> None:
        for i in range(4):
            if not (bug and i >= 1):
                opt.zero_grad()
            _engine_backward(loss_of(model, 2 * i))
            _engine_backward(loss_of(model, 2 * i + 1))
            opt.step()

    res = watched(opt, loop)
    steps = res.steps()
    assert [s.fresh for s in steps] == [8] * 4
    assert [s.stale for s in steps] == ([0, 8, 16, 24] if bug else [0] * 4)
    assert [s.backwards for s in steps] == [1] * 4  # two per step, merged
    assert res.kinds() == ([("missed_reset", "SGD#0", 1, 3)] if bug else [])


def _in_backward_optimizers(model: torch.nn.Module, reset: bool) -> list[Any]:
    """One optimizer per parameter, stepped by the parameter's own post-accumulate hook
    (PyTorch's "fuse the optimizer step into the backward pass" recipe)."""
    opts = {p: torch.optim.SGD([p], lr=0.01) for p in model.parameters()}

    def step_now(p: torch.Tensor) -> None:
        opts[p].step()
        if reset:
            opts[p].zero_grad()

    for p in model.parameters():  # registered before watch(): the probe still runs first
        p.register_post_accumulate_grad_hook(step_now)
    return list(opts.values())


@pytest.mark.parametrize("reset", [True, False])
def test_optimizer_in_backward(watched: Any, reset: bool) -> None:
    model = mlp()
    opts = _in_backward_optimizers(model, reset)

    def loop() -> None:
        for i in range(3):
            loss_of(model, i).backward()

    res = watched(opts, loop)
    steps = res.steps()
    assert len(steps) == 3 * len(opts)
    assert all(s.fresh == 1 and s.backwards == 1 for s in steps)
    n = len(opts)
    assert [s.stale for s in steps] == [0] * n + ([0] * 2 * n if reset else [1] * n + [2] * n)
    expected = [] if reset else sorted(("missed_reset", f"SGD#{k}", 1, 2)
                                       for k in range(len(opts)))
    assert res.kinds() == expected


def test_failure_inside_a_backward_removes_the_hooks_after_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """An internal error in a step run by a hook: the probe turns off, its hooks go once
    the engine is done with them, and the training loop's own hooks keep stepping."""
    from gradwatch.probe.ledger import Ledger

    def broken(ledger: Ledger) -> Any:
        raise ValueError("injected in-backward failure")

    model = mlp()
    opts = _in_backward_optimizers(model, reset=True)
    w0 = model[0].weight.detach().clone()
    monkeypatch.setattr(Ledger, "plain_step", broken)
    with caplog.at_level(logging.ERROR, logger="gradwatch.probe"), gradwatch.watch(
            opts, log=tmp_path / "f.jsonl") as h:
        loss_of(model, 0).backward()
        assert h.disabled and "injected in-backward failure" in h.disabled
        assert all(len(p._post_accumulate_grad_hooks) == 1 for p in model.parameters())
        assert all(not led.incoming for led in h.tracker.ledgers.values())
        loss_of(model, 1).backward()
    assert not torch.equal(w0, model[0].weight)  # the user's hooks stepped
    assert len([r for r in caplog.records if r.levelno >= logging.ERROR]) == 1
