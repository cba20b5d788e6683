"""Norms in the log against a plain per-parameter ``torch.linalg.vector_norm`` loop."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from tests.probe.probe_helpers import loss_of, mlp


def _norms(params: list[torch.Tensor]) -> list[float]:
    return [float(torch.linalg.vector_norm(p.grad)) for p in params]


def _total(xs: list[float]) -> float:
    return math.sqrt(sum(x * x for x in xs))


def test_clean_norms_match_reference(watched: Any) -> None:
    m = mlp()
    extra = torch.nn.Parameter(torch.ones(2))  # never gets a gradient
    params = [*m.parameters(), extra]
    opt = torch.optim.SGD(params, lr=0.01)
    ref: list[list[float]] = []

    def loop() -> None:
        for i in range(3):
            opt.zero_grad()
            loss_of(m, i).backward()
            ref.append(_norms(params[:4]))
            opt.step()

    r = watched(opt, loop)
    for s, want in zip(r.steps(), ref, strict=True):
        assert s.param_norms[:4] == pytest.approx(want, rel=1e-6)
        assert s.param_norms[4] is None
        assert s.norm == pytest.approx(_total(want), rel=1e-6)
        assert s.fresh_norm == pytest.approx(s.norm, rel=1e-6)
        assert s.drift == pytest.approx(1.0)
        assert s.param_fresh_norms[:4] == pytest.approx(want, rel=1e-6)


def test_missed_reset_fresh_norm_and_drift(watched: Any) -> None:
    m = mlp()
    params = list(m.parameters())
    opt = torch.optim.SGD(params, lr=0.01)
    acc: list[list[float]] = []
    fresh: list[list[float]] = []

    def loop() -> None:
        prev = [torch.zeros_like(p) for p in params]
        for i in range(5):
            loss_of(m, i).backward()  # zero_grad forgotten
            acc.append(_norms(params))
            fresh.append([float(torch.linalg.vector_norm(p.grad - q))
                          for p, q in zip(params, prev, strict=True)])
            prev = [p.grad.clone() for p in params]
            opt.step()

    r = watched(opt, loop)
    steps = r.steps()
    assert steps[0].drift == pytest.approx(1.0)
    # first stale step: no copy of the consumed gradient yet, so fresh is unknown
    assert steps[1].fresh_norm is None and steps[1].drift is None
    assert steps[1].norm == pytest.approx(_total(acc[1]), rel=1e-6)
    for s, a, f in zip(steps[2:], acc[2:], fresh[2:], strict=True):
        assert s.param_norms == pytest.approx(a, rel=1e-5)
        assert s.param_fresh_norms == pytest.approx(f, rel=1e-4)
        assert s.fresh_norm == pytest.approx(_total(f), rel=1e-4)
        assert s.drift == pytest.approx(_total(a) / _total(f), rel=1e-4)
        assert s.drift > 1.5


def test_norms_every_n_and_never(watched: Any) -> None:
    m = mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)

    def loop() -> None:
        for i in range(5):
            opt.zero_grad()
            loss_of(m, i).backward()
            opt.step()

    every2 = watched(opt, loop, norms_every=2)
    assert [s.norm is not None for s in every2.steps()] == [True, False, True, False, True]
    never = watched(opt, loop, norms_every=0)
    assert all(s.norm is None and s.param_norms is None for s in never.steps())
    assert all(s.fresh == 4 for s in never.steps())


def test_gradscaler_norms_are_unscaled_and_inf_is_data(watched: Any) -> None:
    m = mlp()
    params = list(m.parameters())
    opt = torch.optim.SGD(params, lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=4096.0)
    ref: list[float] = []

    def loop() -> None:
        for i in range(3):
            opt.zero_grad()
            loss = loss_of(m, i) * (float("inf") if i == 1 else 1.0)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            ref.append(_total(_norms(params)))
            scaler.step(opt)
            scaler.update()

    r = watched(opt, loop)
    s0, s1, s2 = r.steps()
    assert s0.norm == pytest.approx(ref[0], rel=1e-5)
    assert s2.norm == pytest.approx(ref[2], rel=1e-5)
    assert s1.skipped and (math.isnan(s1.norm) or math.isinf(s1.norm))
    assert r.findings == []


@pytest.mark.parametrize("bug", [False, True])
def test_many_small_tensors_grouped_norms(watched: Any, bug: bool) -> None:
    """Equal-shaped small gradients are reduced in stacked groups on CPU: same numbers."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(*[torch.nn.Linear(5, 5) for _ in range(6)], torch.nn.Linear(5, 2))
    params = list(m.parameters())
    opt = torch.optim.SGD(params, lr=0.01)
    acc: list[list[float]] = []

    def loop() -> None:
        for i in range(4):
            if not bug:
                opt.zero_grad()
            x = torch.randn(8, 5, generator=torch.Generator().manual_seed(i))
            m(x).pow(2).mean().backward()
            acc.append(_norms(params))
            opt.step()

    r = watched(opt, loop)
    for s, want in zip(r.steps(), acc, strict=True):
        assert s.param_norms == pytest.approx(want, rel=1e-5)
        assert s.norm == pytest.approx(_total(want), rel=1e-5)
    assert (r.findings != []) == bug


@pytest.mark.parametrize("shapes", [[(512, 8), (512,)], [(5, 5)] * 6], ids=["list", "groups"])
def test_cpu_plan_never_reads_gradients_that_left_the_cpu(shapes: list[tuple[int, ...]]) -> None:
    """On CPU the sample is read to the host at once; once the gradients live elsewhere
    (here the meta device stands in for a GPU) the plan steps aside and nothing is read,
    so no step would wait on a device."""
    from gradwatch.probe import norms

    cpu = [torch.randn(s) for s in shapes]
    plan = norms.CpuPlan.make(cpu)
    assert plan is not None
    first = norms.sample(list(cpu), None, [], [], None, missing=False, plan=plan)
    assert isinstance(first.norms, list)  # host floats
    assert first.norms == pytest.approx([float(torch.linalg.vector_norm(g)) for g in cpu])
    moved = [g.to("meta") for g in cpu]
    later = norms.sample(list(moved), None, [], [], None, missing=False, plan=plan)
    assert isinstance(later.norms, torch.Tensor) and later.norms.device.type == "meta"
    assert plan.failed  # and it is not tried again


def test_cpu_plan_chunks_groups_through_its_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Groups larger than one chunk, a partial last chunk, two dtypes, tensors left out of
    the groups: every norm is the tensor's own, step after step (the buffers are reused),
    and a plan that no longer fits the gradients steps aside instead of answering wrong."""
    from gradwatch.probe import norms

    monkeypatch.setattr(norms.CpuPlan, "_CHUNK", 3 * 4 * 16)  # three 4x4 float32 tensors

    def grads(seed: int) -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        return ([torch.randn(4, 4, generator=g) for _ in range(7)]  # chunks of 3, 3, 1
                + [torch.randn(300, 300, generator=g)]  # too large to group
                + [torch.randn(2, 3, dtype=torch.float64, generator=g) for _ in range(5)]  # 4, 1
                + [torch.randn(9, generator=g)])  # alone in its shape

    first = grads(0)
    plan = norms.CpuPlan.make(first)
    assert plan is not None and len(plan.groups) == 2
    assert [len(buf) for buf, _ in plan.buffers] == [3, 4]  # float64 2x3: four a chunk
    for seed in range(3):
        gs = grads(seed)
        got = plan.norms(gs)
        assert isinstance(got, torch.Tensor)
        want = [float(torch.linalg.vector_norm(g)) for g in gs]
        assert got.tolist() == pytest.approx(want, rel=1e-6)
    reshaped = [*grads(3)[:6], torch.randn(5, 5), *grads(3)[7:]]
    s = norms.sample(list(reshaped), None, [], [], None, missing=False, plan=plan)
    assert plan.failed
    assert s.norms.tolist() == pytest.approx(  # type: ignore[union-attr]
        [float(torch.linalg.vector_norm(g)) for g in reshaped], rel=1e-6)


def test_cpu_plan_dot_norms_are_vector_norms_to_the_edges_of_float32() -> None:
    """Without groups the plan reads each norm as the square root of a dot. It answers what
    ``vector_norm`` answers, also where float32 squares overflow or underflow, for zeros,
    NaN and Inf, in float64; half precision (whose dot overflows early) is never dotted."""
    from gradwatch.probe import norms

    g = torch.Generator().manual_seed(0)
    normal = torch.randn(300, 300, generator=g)
    grads = [normal, normal * 1e18, normal * 1e-25, normal * 1e-21, torch.zeros(7),
             torch.tensor([1.0, math.nan]), torch.tensor([1.0, math.inf]),
             torch.randn(5, dtype=torch.float64, generator=g) * 1e100]
    plan = norms.CpuPlan.make(grads)
    assert plan is not None and plan.dot and not plan.groups
    got = plan.read(grads)
    assert isinstance(got, list)  # host floats
    want = [float(torch.linalg.vector_norm(x)) for x in grads]
    assert got[1] == want[1] == math.inf and got[2] == want[2] == 0.0  # float32's edges
    assert math.isnan(got[5]) and math.isnan(want[5]) and got[6] == want[6] == math.inf
    as_tensor = plan.norms(grads)  # the same norms as one tensor (square roots on it)
    assert as_tensor is not None and as_tensor.dtype == torch.float64  # (float64 promotes)
    assert as_tensor.tolist()[:5] == pytest.approx(got[:5], rel=1e-6)
    del got[5:7], want[5:7]
    assert got == pytest.approx(want, rel=1e-6)
    assert got[3] > 0.0 and got[-1] > 1e100

    halves = [normal.half(), normal.half()]
    reader = norms.CpuPlan.make(grads[:2])
    assert reader is not None and reader.dot
    assert reader.read(halves) is None and reader.failed  # read steps aside too
    assert plan.norms(halves) is None and plan.failed  # the model went half: it steps aside
    half_plan = norms.CpuPlan.make(halves)
    assert half_plan is not None and not half_plan.dot
    read = half_plan.read(halves)
    assert read == pytest.approx([float(torch.linalg.vector_norm(h)) for h in halves])
    assert read is not None and math.isfinite(read[0])  # 300 in half: its dot would be Inf
    strided = norms.CpuPlan.make([normal.t(), normal])
    assert strided is not None and not strided.dot  # a transposed gradient: no copy to dot
