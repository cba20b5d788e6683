"""Fresh norm and drift on steps that re-apply old gradients, when ``.grad`` is rescaled in
place between backward and step: against a slow reference (copies of every ``.grad`` around
each backward, norms by a plain loop; see ``fresh_reference``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from gradwatch.verdict import verdict_of
from tests.probe.fresh_reference import FreshReference, Row
from tests.probe.probe_helpers import loss_of, mlp

Rescale = Callable[[torch.nn.Module, torch.optim.Optimizer], None]


def _clip_norm(max_norm: float) -> Rescale:
    return lambda m, opt: torch.nn.utils.clip_grad_norm_(m.parameters(), max_norm)


def _clip_value(m: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    torch.nn.utils.clip_grad_value_(m.parameters(), 0.02)


def _times(m: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    for k, p in enumerate(m.parameters()):
        p.grad *= 0.5 + 0.25 * k  # a different factor per parameter


RESCALES: dict[str, Rescale] = {
    "clip_grad_norm_small": _clip_norm(0.05),
    "clip_grad_norm_inf": _clip_norm(float("inf")),  # the HF Trainer: every step, no clip
    "clip_grad_value_": _clip_value,
    "grad_times_c": _times,
}
UNIFORM = {"clip_grad_norm_small", "clip_grad_norm_inf"}
"""Rescales that multiply every gradient by one factor: the drift the step reports is the
drift at the backward's end exactly."""


def _check(steps: list[Any], rows: list[Row], stale_from: int, uniform: bool) -> None:
    assert len(steps) == len(rows)
    for s, row in zip(steps, rows, strict=True):
        assert s.norm == pytest.approx(row.norm, rel=1e-5)
        assert s.fresh_norm == pytest.approx(row.fresh_norm, rel=1e-4)
        assert s.drift == pytest.approx(row.drift, rel=1e-4)
        assert s.param_fresh_norms == pytest.approx(row.param_fresh, rel=1e-4, abs=1e-9)
        if uniform:
            assert s.drift == pytest.approx(row.at_backward, rel=1e-4)
    assert all(s.stale for s in steps[stale_from:])
    assert not any(s.stale for s in steps[:stale_from])


@pytest.mark.parametrize("rescale", sorted(RESCALES))
def test_missed_reset_under_in_place_rescale(watched: Any, rescale: str) -> None:
    m = mlp()
    params = list(m.parameters())
    opt = torch.optim.SGD(params, lr=0.01)
    ref = FreshReference(params)

    def loop() -> None:
        for i in range(6):
            ref.backward(loss_of(m, i))  # zero_grad forgotten
            RESCALES[rescale](m, opt)
            ref.read()
            opt.step()

    r = watched(opt, loop)
    steps = r.steps()
    _check(steps, ref.rows, 1, rescale in UNIFORM)
    if rescale == "clip_grad_norm_inf":  # nothing clipped: the drift climbs as without it
        assert steps[-1].drift > 2.0
        assert r.findings[0].kind == "missed_reset"
        summary = verdict_of(r.records).summary()  # what check --json and the run list say
        assert summary["max_drift"] == pytest.approx(max(row.drift for row in ref.rows))


def test_gradscaler_unscale_then_clip(watched: Any) -> None:
    m = mlp()
    params = list(m.parameters())
    opt = torch.optim.SGD(params, lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=2)
    ref = FreshReference(params)

    def loop() -> None:
        for i in range(6):
            ref.backward(scaler.scale(loss_of(m, i)))  # zero_grad forgotten
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            ref.read()
            scaler.step(opt)
            scaler.update()  # the scale grows every two steps: old and fresh alike

    steps = watched(opt, loop).steps()
    assert not any(s.skipped for s in steps)
    _check(steps, ref.rows, 1, uniform=True)


@pytest.mark.parametrize("windows", [[3, 3, 3], [1, 2, 4]])
def test_accumulation_windows_never_reset(watched: Any, windows: list[int]) -> None:
    m = mlp()
    params = list(m.parameters())
    opt = torch.optim.SGD(params, lr=0.01)
    ref = FreshReference(params)

    def loop() -> None:
        i = 0
        for w in windows:
            for _ in range(w):
                ref.backward(loss_of(m, i) / w)
                i += 1
            torch.nn.utils.clip_grad_norm_(params, 0.5)
            ref.read()
            opt.step()  # zero_grad forgotten: the next window adds onto this one

    steps = watched(opt, loop).steps()
    assert [s.backwards for s in steps] == windows
    _check(steps, ref.rows, 1, uniform=True)


def test_zero_grad_once_per_epoch_with_clipping(watched: Any) -> None:
    """Clean steps (right after the epoch's zero_grad) and stale ones alternate; both read
    right, and the drift climbs within each epoch."""
    m = mlp()
    params = list(m.parameters())
    opt = torch.optim.Adam(params, lr=0.01)
    ref = FreshReference(params)

    def loop() -> None:
        for i in range(9):
            if i % 3 == 0:
                opt.zero_grad()
                ref.reset()
            ref.backward(loss_of(m, i))
            torch.nn.utils.clip_grad_norm_(params, 0.2)
            ref.read()
            opt.step()

    steps = watched(opt, loop).steps()
    for s, row in zip(steps, ref.rows, strict=True):
        assert s.drift == pytest.approx(row.drift, rel=1e-4)
        assert s.fresh_norm == pytest.approx(row.fresh_norm, rel=1e-4)
    assert [s.drift == pytest.approx(1.0) for s in steps] == [i % 3 == 0 for i in range(9)]


def test_lbfgs_closure_without_zero_grad(watched: Any) -> None:
    m = mlp()
    params = list(m.parameters())
    opt = torch.optim.LBFGS(params, lr=0.1, max_iter=3)
    ref = FreshReference(params)
    last: list[Row] = []

    def loop() -> None:
        for i in range(3):
            def closure(i: int = i) -> torch.Tensor:
                loss = loss_of(m, i)
                ref.backward(loss)  # no zero_grad: every evaluation adds to the last
                torch.nn.utils.clip_grad_norm_(params, 0.3)
                ref.read()  # the optimizer reads the gradients as the closure returns
                return loss
            opt.step(closure)
            last.append(ref.rows[-1])

    steps = watched(opt, loop).steps()
    assert all(s.closure_evals >= 2 for s in steps)
    for s, row in zip(steps, last, strict=True):  # a step reports its last evaluation
        assert s.norm == pytest.approx(row.norm, rel=1e-5)
        assert s.drift == pytest.approx(row.drift, rel=1e-4)
        assert s.drift == pytest.approx(row.at_backward, rel=1e-4)
        assert s.stale > 0


def test_clean_steps_measure_nothing_more(watched: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fresh part is measured only on an armed optimizer: a clean loop (with clipping)
    never copies a gradient, and a loop resetting by hand stops after its first step."""
    from gradwatch.probe.freshpart import FreshPart

    begun: list[int] = []
    real = FreshPart.begin

    def counted(self: FreshPart, *a: Any) -> None:
        begun.append(1)
        real(self, *a)

    monkeypatch.setattr(FreshPart, "begin", counted)
    m = mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)

    def clean() -> None:
        for i in range(5):
            opt.zero_grad()
            loss_of(m, i).backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 0.1)
            opt.step()

    def by_hand() -> None:
        for i in range(5):
            loss_of(m, i).backward()
            opt.step()
            for p in m.parameters():
                p.grad.zero_()

    assert watched(opt, clean).findings == [] and begun == []
    assert watched(opt, by_hand).findings == [] and len(begun) == 1
