"""Loops that must stay clean: each runs for real under the probe and yields no finding."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from gradwatch.wire import OptimizerInfo
from tests.probe.probe_helpers import batch, loss_of, mlp


def _clean(r: Any) -> None:
    assert r.findings == [], [f.model_dump() for f in r.findings]
    assert r.steps(), "no step recorded"
    for s in r.steps():
        assert (s.stale, s.leaked, s.late_params, s.discarded) == (0, 0, [], 0), s
    # nothing the optimizers do looks like an update by hand or a lifecycle problem
    assert not [x for x in r.records if x.type in ("unowned", "holding")
                or (x.type == "optimizer" and x.manual)]


@pytest.mark.parametrize("set_to_none", [True, False])
def test_zero_backward_step(watched: Any, set_to_none: bool) -> None:
    m = mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)

    def loop() -> None:
        for i in range(4):
            opt.zero_grad(set_to_none=set_to_none)
            loss_of(m, i).backward()
            opt.step()

    r = watched(opt, loop, model=m)
    _clean(r)
    assert [s.fresh for s in r.steps()] == [4] * 4
    assert r.steps()[1].resets[0].how == "optimizer_zero_grad"
    assert r.steps()[1].resets[0].params == [0, 1, 2, 3]


@pytest.mark.parametrize("reset", ["optimizer", "module", "set_none", "zero_", "data_zero_"])
def test_backward_step_zero(watched: Any, reset: str) -> None:
    m = mlp()
    opt = torch.optim.Adam(m.parameters(), lr=0.01)

    def loop() -> None:
        for i in range(4):
            loss_of(m, i).backward()
            opt.step()
            if reset == "optimizer":
                opt.zero_grad()
            elif reset == "module":
                m.zero_grad()
            else:
                for p in m.parameters():
                    if reset == "set_none":
                        p.grad = None
                    elif reset == "zero_":
                        p.grad.zero_()
                    else:
                        p.grad.data.zero_()

    r = watched(opt, loop, model=m)
    _clean(r)
    how = {"optimizer": "optimizer_zero_grad", "module": "module_zero_grad"}.get(reset)
    if how:
        assert {x.how for x in r.steps()[2].resets} == {how}
    elif reset == "set_none":
        assert r.steps()[2].resets[0].how == "set_none"


@pytest.mark.parametrize("windows", [[4, 4, 4], [1, 3, 2, 5], [3, 3, 2]])
def test_accumulation_windows(watched: Any, windows: list[int]) -> None:
    m = mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)

    def loop() -> None:
        i = 0
        for w in windows:  # uneven windows and a short tail are not reset bugs
            for _ in range(w):
                (loss_of(m, i) / w).backward()
                i += 1
            opt.step()
            opt.zero_grad()

    r = watched(opt, loop)
    _clean(r)
    assert [s.backwards for s in r.steps()] == windows
    assert [s.fresh for s in r.steps()] == [4 * w for w in windows]


def test_dcgan(watched: Any) -> None:
    torch.manual_seed(0)
    G = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    D = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LeakyReLU(0.2),
                            torch.nn.Linear(8, 1))
    og = torch.optim.Adam(G.parameters(), lr=2e-4, betas=(0.5, 0.999))
    od = torch.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999))
    bce = torch.nn.BCEWithLogitsLoss()

    def loop() -> None:
        for i in range(4):  # the PyTorch DCGAN example's loop
            g = torch.Generator().manual_seed(i)
            real, z = torch.randn(8, 4, generator=g), torch.randn(8, 3, generator=g)
            D.zero_grad()
            bce(D(real), torch.ones(8, 1)).backward()
            fake = G(z)
            bce(D(fake.detach()), torch.zeros(8, 1)).backward()
            od.step()
            G.zero_grad()
            bce(D(fake), torch.ones(8, 1)).backward()  # fills D's grads; D.zero_grad clears
            og.step()

    r = watched([og, od], loop, names=["G", "D"])
    _clean(r)
    assert [s.backwards for s in r.steps("D")] == [2] * 4


def test_lbfgs_zero_grad_in_closure(watched: Any) -> None:
    m = mlp()
    opt = torch.optim.LBFGS(m.parameters(), lr=0.1, max_iter=4)

    def loop() -> None:
        for i in range(3):
            def closure(i: int = i) -> torch.Tensor:
                opt.zero_grad()
                loss = loss_of(m, i)
                loss.backward()
                return loss
            opt.step(closure)

    r = watched(opt, loop)
    _clean(r)
    assert all(s.closure_evals >= 2 for s in r.steps())
    assert all(s.consumed == 4 * s.closure_evals for s in r.steps())


def test_gradscaler_with_skipped_steps(watched: Any) -> None:
    m = mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)

    def loop() -> None:
        for i in range(6):
            opt.zero_grad()
            loss = loss_of(m, i)
            if i in (1, 4):
                loss = loss * float("inf")  # overflow: GradScaler skips this step
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()

    r = watched(opt, loop, model=m)
    _clean(r)
    assert [s.skipped for s in r.steps()] == [False, True, False, False, True, False]
    assert r.steps()[1].norm != r.steps()[1].norm or r.steps()[1].norm == float("inf")
    # norms are unscaled: compare with a step's gradient of the same loss, unscaled
    assert r.steps()[0].norm is not None and r.steps()[0].norm < 1.0 + 1e-5


def test_several_optimizers_retain_graph(watched: Any) -> None:
    a, b = mlp(0), mlp(1, n_in=2)
    oa = torch.optim.SGD(a.parameters(), lr=0.01)
    ob = torch.optim.SGD(b.parameters(), lr=0.01)

    def loop() -> None:
        for i in range(3):
            oa.zero_grad()
            ob.zero_grad()
            x, y = batch(i)
            h = a(x)
            out = b(h)
            ((out - y) ** 2).mean().backward(retain_graph=True)
            (out.abs().mean() + h.pow(2).mean()).backward()
            oa.step()
            ob.step()

    r = watched([oa, ob], loop)
    _clean(r)
    assert [s.backwards for s in r.steps()] == [2] * 6


def test_inplace_rescaling(watched: Any) -> None:
    m = mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)

    def loop() -> None:
        for i in range(4):
            opt.zero_grad(set_to_none=i % 2 == 0)
            loss_of(m, i).backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 0.1)
            torch.nn.utils.clip_grad_value_(m.parameters(), 0.05)
            for p in m.parameters():
                p.grad *= 0.5
                p.grad.data.mul_(2.0)
            opt.step()

    _clean(watched(opt, loop))


def test_frozen_and_sometimes_unused_params(watched: Any) -> None:
    m = mlp()
    side = torch.nn.Linear(4, 2)
    m[0].weight.requires_grad_(False)  # frozen but held by the optimizer
    opt = torch.optim.AdamW([*m.parameters(), *side.parameters()], lr=0.01)

    def loop() -> None:
        for i in range(6):
            opt.zero_grad(set_to_none=i < 3)
            x, y = batch(i)
            out = m(x)
            if i % 2 == 0:  # the side branch gets no gradient on odd steps
                out = out + side(x)
            ((out - y) ** 2).mean().backward()
            opt.step()

    _clean(watched(opt, loop))


def test_sparse_embedding_sparse_adam(watched: Any) -> None:
    torch.manual_seed(0)
    emb = torch.nn.Embedding(20, 4, sparse=True)
    head = torch.nn.Linear(4, 1)
    o1 = torch.optim.SparseAdam(list(emb.parameters()), lr=0.01)
    o2 = torch.optim.Adam(head.parameters(), lr=0.01)

    def loop() -> None:
        for i in range(4):
            o1.zero_grad()
            o2.zero_grad()
            idx = torch.tensor([i, i + 1, i + 5, i])
            head(emb(idx)).pow(2).mean().backward()
            o1.step()
            o2.step()

    r = watched([o1, o2], loop)
    _clean(r)
    assert all(s.norm is not None and s.norm > 0 for s in r.steps())


def test_param_groups(watched: Any) -> None:
    m = mlp()
    opt = torch.optim.SGD([{"params": m[0].parameters(), "lr": 0.1},
                           {"params": m[2].parameters()}], lr=0.01)

    def loop() -> None:
        for i in range(3):
            opt.zero_grad()
            loss_of(m, i).backward()
            opt.step()

    r = watched(opt, loop, model=m)
    _clean(r)
    info = [x for x in r.records if x.type == "optimizer"][0]
    assert info.groups == [0, 0, 1, 1]
    assert info.params == ["0.weight", "0.bias", "2.weight", "2.bias"]


def test_autograd_grad_never_writes_grad(watched: Any) -> None:
    m = mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)

    def loop() -> None:
        for i in range(3):
            opt.zero_grad()
            loss = loss_of(m, i)
            gs = torch.autograd.grad(loss, list(m.parameters()), create_graph=True)
            penalty = sum(g.pow(2).sum() for g in gs)
            (loss + 0.1 * penalty).backward()
            opt.step()

    r = watched(opt, loop)
    _clean(r)
    assert [s.backwards for s in r.steps()] == [1, 1, 1]


@pytest.mark.parametrize("reentrant", [True, False])
def test_activation_checkpointing(watched: Any, reentrant: bool) -> None:
    m = mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)

    def loop() -> None:
        for i in range(3):
            opt.zero_grad()
            x, y = batch(i)
            x.requires_grad_(reentrant)
            h = checkpoint(m[0], x, use_reentrant=reentrant)
            out = m[2](checkpoint(m[1], h, use_reentrant=reentrant))
            ((out - y) ** 2).mean().backward()
            opt.step()

    r = watched(opt, loop)
    _clean(r)
    assert all(s.fresh == 4 for s in r.steps())


@pytest.mark.parametrize("forget", [False, True])
def test_add_param_group_tracks_the_new_parameters(watched: Any, forget: bool) -> None:
    """Progressive unfreezing: the backbone joins the optimizer at step 3 through
    ``add_param_group``; from then on its parameters are judged and measured like the
    others (and a reset forgotten after that is caught on them too)."""
    torch.manual_seed(0)
    backbone, head = torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)
    backbone.requires_grad_(False)
    opt = torch.optim.SGD(head.parameters(), lr=0.01)

    def loop() -> None:
        for i in range(6):
            if i == 3:
                backbone.requires_grad_(True)
                opt.add_param_group({"params": backbone.parameters(), "lr": 0.001})
            if not (forget and i >= 4):
                opt.zero_grad()
            x, y = batch(i, n_out=2)
            ((head(torch.tanh(backbone(x))) - y) ** 2).mean().backward()
            opt.step()

    res = watched(opt, loop)
    infos = [r for r in res.records if isinstance(r, OptimizerInfo)]
    assert [len(i.params) for i in infos] == [2, 4]
    assert infos[-1].groups == [0, 0, 1, 1] and infos[-1].shapes[2:] == [[8, 4], [8]]
    steps = res.steps()
    assert [s.fresh for s in steps] == [2, 2, 2, 4, 4, 4]
    assert [len(s.param_norms or []) for s in steps] == [2, 2, 2, 4, 4, 4]
    for s in steps[3:]:
        assert s.param_norms is not None and all(n is not None and n > 0 for n in s.param_norms)
    if forget:
        assert res.kinds() == [("missed_reset", "SGD#0", 4, 2)]
        assert steps[4].stale_params == [0, 1, 2, 3]
    else:
        assert res.kinds() == []
        assert all(s.drift == pytest.approx(1.0) for s in steps)
