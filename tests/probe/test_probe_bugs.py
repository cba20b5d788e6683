"""Each reset bug in a real tiny loop: the exact findings (kind, optimizer, steps, params)."""

from __future__ import annotations

from typing import Any

import torch

from tests.probe.probe_helpers import batch, loss_of, mlp

ALL = ["0.weight", "0.bias", "2.weight", "2.bias"]


def test_forgotten_zero_grad(watched: Any) -> None:
    m = mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)

    def loop() -> None:
        for i in range(5):
            loss_of(m, i).backward()
            opt.step()

    r = watched(opt, loop, model=m)
    assert r.kinds() == [("missed_reset", "SGD#0", 1, 4)]
    assert r.findings[0].params == ALL
    assert [s.stale for s in r.steps()] == [0, 4, 8, 12, 16]
    assert [s.fresh for s in r.steps()] == [4] * 5


def test_zero_grad_once_per_epoch(watched: Any) -> None:
    m = mlp()
    opt = torch.optim.Adam(m.parameters(), lr=0.01)

    def loop() -> None:
        for _epoch in range(3):
            opt.zero_grad()
            for i in range(4):
                loss_of(m, i).backward()
                opt.step()

    r = watched(opt, loop, model=m)
    assert r.kinds() == [("missed_reset", "Adam#0", 1, 9)]
    assert [s.step for s in r.steps() if s.stale] == [1, 2, 3, 5, 6, 7, 9, 10, 11]


def test_one_of_two_optimizers_never_reset(watched: Any) -> None:
    enc, head = mlp(0), mlp(1, n_in=2)
    o1 = torch.optim.SGD(enc.parameters(), lr=0.01)
    o2 = torch.optim.SGD(head.parameters(), lr=0.01)

    def loop() -> None:
        for i in range(4):
            o1.zero_grad()  # o2.zero_grad() forgotten
            x, y = batch(i)
            ((head(enc(x)) - y) ** 2).mean().backward()
            o1.step()
            o2.step()

    r = watched([o1, o2], loop, names=["encoder", "head"])
    assert r.kinds() == [("missed_reset", "head", 1, 3)]
    assert r.findings[0].params == ["group0.param0", "group0.param1", "group0.param2",
                                    "group0.param3"]


def test_lbfgs_closure_without_zero_grad(watched: Any) -> None:
    m = mlp()
    opt = torch.optim.LBFGS(m.parameters(), lr=0.1, max_iter=3)

    def loop() -> None:
        for i in range(2):
            def closure(i: int = i) -> torch.Tensor:
                loss = loss_of(m, i)
                loss.backward()  # no zero_grad: every evaluation adds to the last
                return loss
            opt.step(closure)

    r = watched(opt, loop, model=m)
    assert r.kinds() == [("missed_reset", "LBFGS#0", 0, 2)]
    assert all(s.closure_evals >= 2 for s in r.steps())


def test_untouched_param_keeps_consumed_grad(watched: Any) -> None:
    m = mlp()
    extra = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([*m.parameters(), extra], lr=0.01)

    def loop() -> None:
        for i in range(4):
            for p in m.parameters():  # resets only the model's params
                p.grad = None
            loss = loss_of(m, i)
            if i == 0:
                loss = loss + extra.sum()
            loss.backward()
            opt.step()

    r = watched(opt, loop)
    assert r.kinds() == [("missed_reset", "SGD#0", 1, 3)]
    assert r.findings[0].params == ["group0.param4"]


def test_gan_cross_optimizer_leak(watched: Any) -> None:
    # The leak: D is never cleared between G's backward and D's next step.
    torch.manual_seed(0)
    G = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
    D = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    og = torch.optim.Adam(G.parameters(), lr=1e-3)
    od = torch.optim.Adam(D.parameters(), lr=1e-3)
    bce = torch.nn.functional.binary_cross_entropy_with_logits

    def leaky() -> None:
        for i in range(4):
            g = torch.Generator().manual_seed(i)
            real, z = torch.randn(8, 4, generator=g), torch.randn(8, 3, generator=g)
            fake = G(z)
            d_loss = bce(D(real), torch.ones(8, 1)) + bce(D(fake.detach()), torch.zeros(8, 1))
            d_loss.backward()
            od.step()
            od.zero_grad()
            G.zero_grad()
            g_loss = bce(D(fake), torch.ones(8, 1))
            g_loss.backward()  # fills D's grads; nothing clears them before D's next step
            og.step()

    r = watched([og, od], leaky, names=["G", "D"])
    assert r.kinds() == [("cross_optimizer_leak", "D", 1, 3)]
    assert r.findings[0].params == ["group0.param0", "group0.param1", "group0.param2",
                                    "group0.param3"]
    assert [s.leaked for s in r.steps("D")] == [0, 4, 4, 4]


def test_late_reset(watched: Any) -> None:
    m = mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)

    def loop() -> None:
        for i in range(3):
            loss_of(m, i).backward()
            opt.zero_grad()  # between backward and step
            opt.step()

    r = watched(opt, loop, model=m)
    assert r.kinds() == [("late_reset", "SGD#0", 0, 3)]
    assert r.findings[0].params == ALL
    assert all(s.consumed == 0 for s in r.steps())
    assert all(any(x.after_backward for x in s.resets) for s in r.steps())


def test_late_reset_by_set_none(watched: Any) -> None:
    m = mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)

    def loop() -> None:
        for i in range(3):
            loss_of(m, i).backward()
            m[2].weight.grad = None  # one parameter loses its gradient before the step
            opt.step()
            opt.zero_grad()

    r = watched(opt, loop, model=m)
    assert r.kinds() == [("late_reset", "SGD#0", 0, 3)]
    assert r.findings[0].params == ["2.weight"]


def test_zero_grad_inside_accumulation_window(watched: Any) -> None:
    m = mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)

    def loop() -> None:
        for i in range(8):
            opt.zero_grad()  # wrong place: inside the window
            (loss_of(m, i) / 4).backward()
            if (i + 1) % 4 == 0:
                opt.step()

    r = watched(opt, loop, model=m)
    assert r.kinds() == [("discarded_accumulation", "SGD#0", 0, 2)]
    assert r.findings[0].params == ALL
    assert [s.discarded for s in r.steps()] == [12, 12]
    assert [s.fresh for s in r.steps()] == [4, 4]
