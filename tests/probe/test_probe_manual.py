"""Loops with no optimizer: updates by hand are the steps of the virtual optimizer ``manual``,
judged by the same four kinds; updates that are not steps stay out of it."""

from __future__ import annotations

import copy
from collections.abc import Callable
from itertools import count
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from gradwatch.verdict import verdict_of
from gradwatch.wire import OptimizerInfo, Step
from tests.probe.probe_helpers import batch, loss_of, mlp


def _manual(r: Any) -> list[Step]:
    infos = [x for x in r.records if isinstance(x, OptimizerInfo) and x.manual]
    assert {i.opt for i in infos} <= {"manual"}
    return r.steps("manual")


def _no_manual(r: Any) -> None:
    assert not [x for x in r.records if isinstance(x, OptimizerInfo) and x.manual]
    assert r.findings == [], [f.model_dump() for f in r.findings]


def _regression(bug: bool, batches: int = 12) -> tuple[torch.nn.Module, Callable[[], None],
                                                       list[float]]:
    """pytorch/examples' regression loop: ``fc.zero_grad()``, backward, then
    ``param.data.add_(-0.1 * param.grad)``; ``norms`` gets each update's gradient norm."""
    torch.manual_seed(0)
    w_target, b_target = torch.randn(4, 1) * 5, torch.randn(1) * 5
    fc = torch.nn.Linear(4, 1)
    norms: list[float] = []

    def loop() -> None:
        for batch_idx in count(1):
            x = torch.randn(32).unsqueeze(1)
            x = torch.cat([x ** i for i in range(1, 5)], 1)
            y = x.mm(w_target) + b_target.item()
            if not bug:
                fc.zero_grad()
            output = F.smooth_l1_loss(fc(x), y)
            output.backward()
            norms.append(float(torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(p.grad) for p in fc.parameters()]))))
            for param in fc.parameters():
                param.data.add_(-0.1 * param.grad)
            if batch_idx >= batches:
                break

    return fc, loop, norms


def test_regression_example_is_clean_and_counted(watched: Any) -> None:
    fc, loop, norms = _regression(bug=False)
    r = watched(None, loop, model=fc)
    assert r.findings == []
    steps = _manual(r)
    assert len(steps) == 12  # every update, the last one seen when the watch closes
    assert all(s.fresh == 2 and s.stale == 0 for s in steps)
    assert [s.norm for s in steps] == pytest.approx(norms)
    info = next(x for x in r.records if isinstance(x, OptimizerInfo))
    assert sorted(info.params) == ["bias", "weight"]
    summary = verdict_of([*r.records]).summary()
    assert summary["steps"] == summary["manual_steps"] == 12


def test_regression_example_without_zero_grad_is_a_missed_reset(watched: Any) -> None:
    fc, loop, _ = _regression(bug=True)
    r = watched(None, loop, model=fc)
    assert r.kinds() == [("missed_reset", "manual", 1, 11)]
    assert sorted(r.findings[0].params) == ["bias", "weight"]
    assert "model.zero_grad()" in r.findings[0].fix
    steps = _manual(r)
    assert [s.stale for s in steps] == [2 * i for i in range(12)]
    assert steps[-1].drift is not None and steps[-1].drift > 2


class _RNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Embedding(20, 6)
        self.rnn = torch.nn.LSTM(6, 8)
        self.decoder = torch.nn.Linear(8, 20)

    def forward(self, x: torch.Tensor, h: Any) -> tuple[torch.Tensor, Any]:
        out, h = self.rnn(self.encoder(x), h)
        return self.decoder(out), h


@pytest.mark.parametrize("bug", [False, True])
def test_word_language_model_loop(watched: Any, bug: bool) -> None:
    """pytorch/examples' word_language_model: model.zero_grad(), clip_grad_norm_, then
    ``p.data.add_(p.grad, alpha=-lr)`` (no version bump: values tell)."""
    torch.manual_seed(0)
    model = _RNN()

    def loop() -> None:
        hidden = None
        for i in range(10):
            g = torch.Generator().manual_seed(i)
            data = torch.randint(0, 20, (5, 3), generator=g)
            targets = torch.randint(0, 20, (15,), generator=g)
            if hidden is not None:
                hidden = tuple(h.detach() for h in hidden)
            if not bug:
                model.zero_grad()
            output, hidden = model(data, hidden)
            F.cross_entropy(output.view(-1, 20), targets).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-20)

    r = watched(None, loop, model=model)
    n = len(list(model.parameters()))
    assert len(_manual(r)) == 10
    if bug:
        assert r.kinds() == [("missed_reset", "manual", 1, 9)]
        assert len(r.findings[0].params) == n
    else:
        assert r.findings == []
        assert {x.how for s in _manual(r)[1:] for x in s.resets} == {"module_zero_grad"}


@pytest.mark.parametrize("form", ["no_grad", "detach"])
@pytest.mark.parametrize("reset", ["zero_", "set_none", "none"])
def test_parameters_updated_in_place(watched: Any, form: str, reset: str) -> None:
    """``with torch.no_grad(): p -= lr * p.grad`` and ``p.detach().add_(...)`` move the
    version; resets by hand after the update are seen after the step."""
    m = mlp()
    norms: list[float] = []

    def loop() -> None:
        for i in range(8):
            loss_of(m, i).backward()
            norms.append(float(torch.linalg.vector_norm(torch.stack(
                [torch.linalg.vector_norm(p.grad) for p in m.parameters()]))))
            for p in m.parameters():
                if form == "no_grad":
                    with torch.no_grad():
                        p -= 0.01 * p.grad
                else:
                    p.detach().add_(p.grad, alpha=-0.01)
                if reset == "zero_":
                    p.grad.zero_()
                elif reset == "set_none":
                    p.grad = None

    r = watched(None, loop, model=m)
    steps = _manual(r)
    assert len(steps) == 8
    if reset == "none":
        assert r.kinds() == [("missed_reset", "manual", 1, 7)]
        return
    assert r.findings == []
    assert {x.how for s in steps[1:] for x in s.resets} == {reset}
    got = [s.norm for s in steps]
    if reset == "zero_":  # zeroed in place before the step was seen: measured from then on
        assert got[0] is None
        got, norms = got[1:], norms[1:]
    assert got == pytest.approx(norms)


@pytest.mark.parametrize("reset", ["zero_", "set_none", "none"])
def test_plain_leaf_tensors(watched: Any, reset: str) -> None:
    """``W = torch.randn(4, 2, requires_grad=True)``: in a loop with no optimizer a plain
    tensor joins ``manual`` at its first update, so every update is a step (the last one
    closed when the watch ends), named after its variable."""
    torch.manual_seed(0)
    W = torch.randn(4, 2, requires_grad=True)
    b = torch.zeros(2, requires_grad=True)

    def loop() -> None:
        for i in range(20):
            x, y = batch(i)
            ((x @ W + b - y) ** 2).mean().backward()
            with torch.no_grad():
                W.sub_(0.01 * W.grad)
                b.sub_(0.01 * b.grad)
            if reset == "zero_":
                W.grad.zero_()
                b.grad.zero_()
            elif reset == "set_none":
                W.grad = b.grad = None

    r = watched(None, loop)
    steps = _manual(r)
    assert [s.step for s in steps] == list(range(20))
    assert all(s.backwards == 1 for s in steps)  # one update each
    info = next(x for x in r.records if isinstance(x, OptimizerInfo))
    assert sorted(info.params) == ["W", "b"]
    if reset == "none":
        [f] = r.findings
        assert (f.kind, f.optimizer, f.first_step, f.steps) == ("missed_reset", "manual", 1, 19)
        assert [s.stale for s in steps] == [2 * i for i in range(20)]
    else:
        assert r.findings == []
        assert all(s.fresh == 2 and s.stale == 0 for s in steps)


@pytest.mark.parametrize("zero_inside", [False, True])
def test_accumulation_by_hand(watched: Any, zero_inside: bool) -> None:
    m = mlp()

    def loop() -> None:
        for w in range(5):
            for k in range(3):
                (loss_of(m, 3 * w + k) / 3).backward()
                if zero_inside and k == 1:
                    m.zero_grad()  # throws the window's first two backwards away
            with torch.no_grad():
                for p in m.parameters():
                    p -= 0.01 * p.grad
            m.zero_grad()

    r = watched(None, loop, model=m)
    steps = _manual(r)
    assert len(steps) == 5
    if zero_inside:
        assert r.kinds() == [("discarded_accumulation", "manual", 1, 4)]
    else:
        assert r.findings == []
        assert [s.backwards for s in steps[1:]] == [3, 3, 3, 3]


def test_manual_beside_an_optimizer(watched: Any) -> None:
    """G by an optimizer, D by hand (its grads also filled by G's backward and cleared by
    D.zero_grad() first thing): clean; D's updates are ``manual`` steps."""
    torch.manual_seed(0)
    G = torch.nn.Linear(3, 4)
    D = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    og = torch.optim.Adam(G.parameters(), lr=1e-3)

    def loop() -> None:
        for i in range(8):
            g = torch.Generator().manual_seed(i)
            real, z = torch.randn(8, 4, generator=g), torch.randn(8, 3, generator=g)
            D.zero_grad()
            (F.softplus(D(G(z).detach())) + F.softplus(-D(real))).mean().backward()
            for p in D.parameters():
                p.data.add_(p.grad, alpha=-0.01)
            og.zero_grad()
            F.softplus(-D(G(z))).mean().backward()
            og.step()

    r = watched(og, loop)
    assert r.findings == []
    assert len(_manual(r)) == 8 and len(r.steps("Adam#0")) == 8


def test_updates_that_are_not_steps_stay_out(watched: Any) -> None:
    """EMA/teacher copies (no grad), weight clamping through .data (WGAN), in-place
    initialisation before training, and optimizer steps themselves: no ``manual``."""
    m = mlp()
    with torch.no_grad():
        torch.nn.init.xavier_uniform_(m[0].weight)
    teacher = copy.deepcopy(m).requires_grad_(False)
    averaged = torch.optim.swa_utils.AveragedModel(m)  # its copies keep requires_grad
    opt = torch.optim.RMSprop(m.parameters(), lr=1e-3)

    def loop() -> None:
        for i in range(12):
            opt.zero_grad()
            x, y = batch(i)
            with torch.no_grad():
                target = teacher(x)
            (((m(x) - y) ** 2).mean() + ((m(x) - target) ** 2).mean()).backward()
            opt.step()
            for p in m.parameters():
                p.data.clamp_(-0.5, 0.5)
            with torch.no_grad():
                for pt, p in zip(teacher.parameters(), m.parameters(), strict=True):
                    pt.mul_(0.9).add_(p, alpha=0.1)
            averaged.update_parameters(m)

    _no_manual(watched(opt, loop, model=m))


def test_adversarial_perturbations_are_not_parameters(watched: Any) -> None:
    """PGD: a perturbation made for each batch, updated through .data for some backwards,
    then dropped: never held by ``manual`` (it would stay alive)."""
    m = mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)

    def loop() -> None:
        for i in range(10):
            x, y = batch(i)
            delta = torch.zeros_like(x).uniform_(-0.1, 0.1)
            delta.requires_grad = True
            for _ in range(6):
                ((m(x + delta) - y) ** 2).mean().backward()
                delta.data = (delta + 0.01 * delta.grad.sign()).clamp(-0.1, 0.1)
                delta.grad.zero_()
            opt.zero_grad()
            ((m(x + delta.detach()) - y) ** 2).mean().backward()
            opt.step()

    r = watched(opt, loop, model=m)
    assert not [x for x in r.records if isinstance(x, OptimizerInfo) and x.manual]
    assert not [f for f in r.findings if f.kind in ("untrained_params", "idle_optimizer")]
