"""Norms in the log against a plain per-parameter ``torch.linalg.vector_norm`` loop."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from gradwatch.encoding import as_float32
from tests.probe.probe_helpers import batch, loss_of, mlp


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
    # from the first stale step on: measured around the backward of the armed optimizer
    for s, a, f in zip(steps[1:], acc[1:], fresh[1:], strict=True):
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
    from gradwatch.probe import cpuplan, norms

    cpu = [torch.randn(s) for s in shapes]
    plan = cpuplan.CpuPlan.make(cpu)
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
    from gradwatch.probe import cpuplan, norms

    monkeypatch.setattr(cpuplan.CpuPlan, "_CHUNK", 3 * 4 * 16)  # three 4x4 float32 tensors

    def grads(seed: int) -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        return ([torch.randn(4, 4, generator=g) for _ in range(7)]  # chunks of 3, 3, 1
                + [torch.randn(300, 300, generator=g)]  # too large to group
                + [torch.randn(2, 3, dtype=torch.float64, generator=g) for _ in range(5)]  # 4, 1
                + [torch.randn(9, generator=g)])  # alone in its shape

    first = grads(0)
    plan = cpuplan.CpuPlan.make(first)
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


def test_cpu_plan_slots_read_the_floor_kernels_values_to_the_edges_of_float32() -> None:
    """Without groups the plan writes each norm into a slot of one buffer, the memory of a
    host array the values are read from. It answers what ``_foreach_norm`` answers, bit for
    bit, also where float32 squares overflow or underflow, for zeros, NaN and Inf, strided
    and float64; a gradient of another dtype, or one that requires grad, or another number
    of them, retires the plan (no wrong value); mixed or half precision gradients keep
    ``_foreach_norm``."""
    from gradwatch.probe import cpuplan, norms

    g = torch.Generator().manual_seed(0)
    normal = torch.randn(300, 300, generator=g)
    grads = [normal, normal * 1e18, normal * 1e-25, normal * 1e-21, torch.zeros(7),
             torch.tensor([1.0, math.nan]), torch.tensor([1.0, math.inf]), normal.t()]
    plan = cpuplan.CpuPlan.make(grads)
    assert plan is not None and len(plan.slots) == len(grads) and not plan.groups
    got = plan.read(grads)
    assert isinstance(got, list)  # host floats
    floor = [float(n) for n in torch._foreach_norm(grads)]
    want = [float(torch.linalg.vector_norm(x)) for x in grads]
    assert got[1] == want[1] == math.inf and got[2] == want[2] == 0.0  # float32's edges
    assert math.isnan(got[5]) and math.isnan(want[5]) and got[6] == want[6] == math.inf
    assert got[3] > 0.0 and got[7] == got[0]  # the transposed gradient, strided
    as_tensor = plan.norms(grads)  # the same norms as one tensor, a copy of the buffer
    assert as_tensor is not None and as_tensor.data_ptr() != plan.out.data_ptr()  # type: ignore[union-attr]
    for values in (got, as_tensor.tolist()):
        del values[5]
        assert values == [x for k, x in enumerate(floor) if k != 5]  # bit for bit
    plan.out.zero_()  # type: ignore[union-attr]  # the host reads the slots' own memory
    assert plan.host is not None and plan.host.tolist() == [0.0] * len(grads)

    wide = [torch.randn(5, dtype=torch.float64, generator=g) * 1e100, normal.double()]
    wide_plan = cpuplan.CpuPlan.make(wide)
    assert wide_plan is not None and wide_plan.out is not None
    assert wide_plan.out.dtype == torch.float64
    assert wide_plan.read(wide) == [float(n) for n in torch._foreach_norm(wide)]

    halves = [normal.half(), normal.half()]
    moved = [normal.to("meta"), normal.to("meta")]  # off the CPU, as to a GPU: no kernel
    for changed in (halves, wide, moved, [normal], [normal] * 3):  # went half, double, or
        # moved, or another number of them: it steps aside
        pair = cpuplan.CpuPlan.make([normal, normal])
        assert pair is not None and pair.out is not None
        assert pair.read(changed) is None and pair.failed
    sampled = norms.sample(list(halves), None, [], [], None, missing=False)
    assert sampled.norms == pytest.approx([float(torch.linalg.vector_norm(h)) for h in halves])
    for other in (halves, [normal, normal.double()]):
        other_plan = cpuplan.CpuPlan.make(other)
        assert other_plan is not None and other_plan.out is None
        read = other_plan.read(other)
        assert read == pytest.approx([float(torch.linalg.vector_norm(x)) for x in other])
    assert math.isfinite(cpuplan.CpuPlan.make(halves).read(halves)[0])  # type: ignore[union-attr,index]

    graphed = [normal.clone().requires_grad_()]  # a create_graph gradient
    graphed_plan = cpuplan.CpuPlan.make(graphed)
    assert graphed_plan is not None and graphed_plan.read(graphed) is None
    assert graphed_plan.failed


def _digits(x: float) -> int:
    """Significant digits of ``x``'s shortest text."""
    return len(repr(x).split("e")[0].replace(".", "").replace("-", "").lstrip("0"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_scalars_are_recorded_to_the_precision_their_parts_carry(watched: Any,
                                                                 dtype: torch.dtype) -> None:
    m = mlp().to(dtype)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    losses: list[float] = []

    def loop() -> None:
        for i in range(4):
            opt.zero_grad()
            x, y = batch(i)
            loss = ((m(x.to(dtype)) - y.to(dtype)) ** 2).mean()
            losses.append(loss.item())
            loss.backward()
            opt.step()

    r = watched(opt, loop)
    steps = r.steps()
    f32 = dtype == torch.float32
    for s, loss in zip(steps, losses, strict=True):
        assert s.norm == pytest.approx(_total(s.param_norms), rel=1e-8)
        if f32:  # 9 digits: the float32 loss comes back exact when rounded to float32
            assert _digits(s.norm) <= 9 and _digits(s.loss) <= 9
            assert as_float32(s.loss) == loss
        else:  # a float64 model's figures keep every digit
            assert s.loss == loss
            assert s.norm == math.hypot(*s.param_norms)
    if not f32:
        assert max(_digits(s.norm) for s in steps) > 9
