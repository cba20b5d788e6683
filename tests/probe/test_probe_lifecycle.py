"""The two lifecycle findings in real tiny loops: gradients no optimizer applies
(``untrained_params``) and an optimizer with no gradient to apply (``idle_optimizer``)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from gradwatch.wire import Holding, Unowned
from tests.probe.probe_helpers import batch, loss_of, mlp


def _train(m: torch.nn.Module, *opts: torch.optim.Optimizer, steps: int = 12) -> Any:
    def loop() -> None:
        for i in range(steps):
            for o in opts:
                o.zero_grad()
            loss_of(m, i).backward()
            for o in opts:
                o.step()

    return loop


def _lifecycle(r: Any) -> list[tuple[str, str, list[str]]]:
    return sorted((f.kind, f.optimizer, f.params) for f in r.findings
                  if f.kind in ("untrained_params", "idle_optimizer"))


def test_head_replaced_after_the_optimizer(watched: Any) -> None:
    m = mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    m[2] = torch.nn.Linear(8, 2)  # the new head: the optimizer still holds the old one

    r = watched(opt, _train(m, opt), model=m)
    assert _lifecycle(r) == [("untrained_params", "(no optimizer)", ["2.weight", "2.bias"])]
    [f] = r.findings
    assert "replaced after SGD#0 was built" in f.message and "add_param_group" in f.fix
    [u] = [x for x in r.records if isinstance(x, Unowned)][-1:]
    assert (u.count, u.numel, u.shapes) == (2, 18, [[2, 8], [2]])
    assert u.step == 12 and u.backwards == 3  # walked: a session's first three backwards
    [h] = [x for x in r.records if isinstance(x, Holding)]
    assert (h.held, h.never, h.requiring) == (True, [2, 3], 4)


def test_weight_norm_applied_after_the_optimizer(watched: Any) -> None:
    """A model changed after its optimizer was built (a parametrization replaces the
    weight by two new parameters): the new ones never train."""
    m = mlp()
    opt = torch.optim.Adam(m.parameters(), lr=0.01)
    torch.nn.utils.parametrizations.weight_norm(m[2])

    r = watched(opt, _train(m, opt), model=m)
    [f] = r.findings
    assert f.kind == "untrained_params"
    assert sorted(f.params) == ["2.parametrizations.weight.original0",
                                "2.parametrizations.weight.original1"]
    assert "Adam#0 holds 1 parameter of the same shapes" in f.message


def test_backbone_left_out_of_the_optimizer(watched: Any) -> None:
    m = mlp()
    opt = torch.optim.SGD(m[2].parameters(), lr=0.01)  # the backbone still requires grad

    r = watched(opt, _train(m, opt), model=m)
    assert _lifecycle(r) == [("untrained_params", "(no optimizer)", ["0.weight", "0.bias"])]
    f = r.findings[0]
    assert "for nothing" in f.message and "requires_grad_(False)" in f.fix
    assert (f.first_step, f.last_step) == (0, 12)


@pytest.mark.parametrize("how", ["copy", "wrapped", "moved"])
def test_optimizer_over_another_copy_of_the_model(watched: Any, how: str) -> None:
    m = mlp()
    if how == "copy":
        opt = torch.optim.SGD(copy.deepcopy(m).parameters(), lr=0.01)
    elif how == "wrapped":  # built, then the model wrapped around a copy of itself
        opt = torch.optim.SGD(m.parameters(), lr=0.01)
        m = torch.nn.Sequential(copy.deepcopy(m))
    else:  # built, then moved with new parameter objects (as moves to XLA devices do)
        opt = torch.optim.SGD(m.parameters(), lr=0.01)
        overwrite = torch.__future__.get_overwrite_module_params_on_conversion()
        torch.__future__.set_overwrite_module_params_on_conversion(True)
        try:
            m = m.to(torch.float64).to(torch.float32)
        finally:
            torch.__future__.set_overwrite_module_params_on_conversion(overwrite)

    r = watched(opt, _train(m, opt), model=m)
    kinds = _lifecycle(r)
    assert [k[:2] for k in kinds] == [("idle_optimizer", "SGD#0"),
                                      ("untrained_params", "(no optimizer)")]
    idle = next(f for f in r.findings if f.kind == "idle_optimizer")
    assert (idle.first_step, idle.last_step, idle.steps) == (0, 11, 12)
    assert "none of its 4 parameters" in idle.message and "another copy" in idle.message
    assert len(kinds[1][2]) == 4


def test_optimizer_the_loss_never_reaches(watched: Any) -> None:
    m, aux = mlp(), torch.nn.Linear(4, 4)  # aux is never used by the loss
    o1 = torch.optim.SGD(m.parameters(), lr=0.01)
    o2 = torch.optim.SGD(aux.parameters(), lr=0.01)

    r = watched([o1, o2], _train(m, o1, o2), names=["main", "aux"])
    assert [(f.kind, f.optimizer) for f in r.findings] == [("idle_optimizer", "aux")]


def test_an_optimizer_idle_only_at_first_is_no_finding(watched: Any) -> None:
    """An optimizer whose module joins the loss at step 4: idle for a while, then not
    (the later record withdraws the finding)."""
    m, extra = mlp(), torch.nn.Linear(2, 2)
    o1 = torch.optim.SGD(m.parameters(), lr=0.01)
    o2 = torch.optim.SGD(extra.parameters(), lr=0.01)

    def loop() -> None:
        for i in range(12):
            o1.zero_grad()
            o2.zero_grad()
            x, y = batch(i)
            out = m(x)
            if i >= 4:
                out = extra(out)
            ((out - y) ** 2).mean().backward()
            o1.step()
            o2.step()

    r = watched([o1, o2], loop)
    assert r.findings == []
    held = [x.held for x in r.records if isinstance(x, Holding) and x.opt == "SGD#1"]
    assert held == [False, True]


@pytest.mark.parametrize("how", ["frozen", "toggled", "add_param_group"])
def test_frozen_backbones_stay_clean(watched: Any, how: str) -> None:
    """requires_grad_(False), also toggled (progressive unfreezing into an optimizer that
    held the frozen backbone from the start, or added to it later)."""
    m = mlp()
    m[0].requires_grad_(False)
    opt = torch.optim.SGD(m.parameters() if how == "toggled" else m[2].parameters(),
                          lr=0.01)

    def loop() -> None:
        for i in range(16):
            if i == 8 and how != "frozen":
                m[0].requires_grad_(True)
                if how == "add_param_group":
                    opt.add_param_group({"params": m[0].parameters(), "lr": 1e-3})
            if i == 12 and how == "toggled":
                m[0].requires_grad_(False)
            opt.zero_grad()
            loss_of(m, i).backward()
            opt.step()

    r = watched(opt, loop, model=m)
    assert r.findings == []
    assert not [x for x in r.records if isinstance(x, (Unowned, Holding))]


def test_teachers_penalties_and_autograd_grad_stay_clean(watched: Any) -> None:
    """An EMA teacher, a gradient penalty on interpolated inputs (a leaf made to require
    grad), torch.autograd.grad, an unwatched second optimizer (held elsewhere)."""
    torch.manual_seed(0)
    G = torch.nn.Linear(3, 2)
    D = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    teacher = copy.deepcopy(G).requires_grad_(False)
    og = torch.optim.Adam(G.parameters(), lr=1e-3)
    od = torch.optim.Adam(D.parameters(), lr=1e-3)  # not watched

    def loop() -> None:
        for i in range(12):
            x, y = batch(i, n_in=3)
            od.zero_grad()
            fake = G(x).detach()
            a = torch.rand(16, 1)
            inter = (a * y + (1 - a) * fake).requires_grad_(True)
            (g,) = torch.autograd.grad(D(inter).sum(), inter, create_graph=True)
            (D(fake).mean() - D(y).mean() + ((g.norm(dim=1) - 1) ** 2).mean()).backward()
            od.step()
            og.zero_grad()
            with torch.no_grad():
                target = teacher(x)
            (-D(G(x)).mean() + ((G(x) - target) ** 2).mean()).backward()
            og.step()
            with torch.no_grad():
                for pt, p in zip(teacher.parameters(), G.parameters(), strict=True):
                    pt.lerp_(p, 0.1)

    r = watched(og, loop, model=G)
    assert r.findings == []
    assert not [x for x in r.records if isinstance(x, (Unowned, Holding))]


def test_backward_restricted_to_the_optimized_inputs_stays_clean(watched: Any) -> None:
    """``loss.backward(inputs=...)`` writes only the head's gradients: the backbone, which
    requires grad and no optimizer holds, gets none."""
    m = mlp()
    head = list(m[2].parameters())
    opt = torch.optim.SGD(head, lr=0.01)

    def loop() -> None:
        for i in range(12):
            opt.zero_grad()
            loss_of(m, i).backward(inputs=head)
            opt.step()

    r = watched(opt, loop, model=m)
    assert r.findings == [] and m[0].weight.grad is None
