"""The probe benchmarks (its overhead, its islands, its calls) still run end to end (figures are not
judged here: a timed unit test would only measure the machine; see README, Benchmarks)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parents[2] / "bench" / "probe_overhead.py"


def test_probe_overhead_prints_every_figure_for_both_models() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--blocks", "1", "--steps", "2", "--wait-blocks", "1",
         "--wait-seconds", "0.05"], capture_output=True, text=True, timeout=300, check=True
    ).stdout
    for model in ("MLP 784-512-512-10", "200 x Linear(64,64)"):
        for clock in ("wall", "cpu"):
            assert f"{model}, batch 64: median step, ms ({clock} clock, 1 blocks)" in out
    for line in ("baseline", "judging only", "norms every step", "floor (norms alone)",
                 "right after the step (gradients warm)", "read by stacking them",
                 "paired by block", "standard error of the median",
                 "bare reader in place", "the writer's drains",
                 "the writer thread drained during the timed steps of"):
        assert out.count(line) >= 2, line


def test_calls_prints_each_mode_for_both_models_and_run_hooks_like_watch() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH.with_name("calls.py")), "--steps", "4", "--warm", "4"],
        capture_output=True, text=True, timeout=300, check=True
    ).stdout
    rows = {tuple(x.split()[:3]): x.split()[3:6] for x in out.splitlines()[1:]}
    for model in ("MLP", "many-tensor"):
        for mode in ("judging", "norms", "run"):
            assert (model, mode, "this") in rows, (model, mode)
        # (counts, not times: the same on any machine) ``gradwatch run``'s session makes
        # the calls ``watch(opt)`` makes: its step hooks are its own, not a shared loop
        assert rows[(model, "run", "this")] == rows[(model, "judging", "this")], model
    # the writer thread's calls per step record end each row: a record is made per step
    writer = {tuple(x.split()[:3]): x.split("writer ")[1] for x in out.splitlines()[1:]}
    for model in ("MLP", "many-tensor"):
        judged = writer[(model, "judging", "this")]
        assert judged.endswith(" a record") and judged == writer[(model, "run", "this")]
        assert float(judged.split(" / ")[0]) > 10, judged  # the record, its line, the verdict


def test_islands_prints_every_segment_for_both_models() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH.with_name("islands.py")), "--blocks", "2", "--steps", "2"],
        capture_output=True, text=True, timeout=300, check=True
    ).stdout
    for model in ("MLP 784-512-512-10", "200 x Linear(64,64)"):
        assert f"{model}, batch 64: each segment of a step, us (2 blocks of 2 steps" in out
    for segment in ("zero_grad", "forward", "backward island", "backward rest",
                    "step island", "step rest", "islands", "sum of segments"):
        assert out.count(f"  {segment} ") == 2, segment
    # one figure per mode on each segment's line, with its standard error
    line = next(x for x in out.splitlines() if x.startswith("  step island"))
    assert line.count("+-") == 3
    header = next(x for x in out.splitlines() if x.startswith("  segment"))
    assert header.split()[1:] == ["baseline", "judging", "norms", "skeleton"]
    assert out.count("the probe's own work in its islands (judging's minus the skeleton's)") == 2


def test_the_islands_skeleton_sees_each_call_and_leaves_torch_as_it_was() -> None:
    sys.path.insert(0, str(BENCH.parent))
    try:
        import islands
    finally:
        sys.path.remove(str(BENCH.parent))
    model = torch.nn.Linear(3, 2)
    w, b = model.weight, model.bias
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = torch.optim.Optimizer.zero_grad, torch.autograd.backward
    seen: list[list[object]] = []
    with islands.skeleton(opt) as hits:
        opt.register_step_pre_hook(lambda *_: seen.append(list(hits)))  # after its own
        first = opt.register_step_pre_hook(lambda *_: seen.append(list(hits)))
        opt._optimizer_step_pre_hooks.move_to_end(first.id, last=False)  # before its own
        opt.zero_grad()
        model(torch.ones(1, 3)).sum().backward()
        opt.step()
    # a reset, a backward's marker, each parameter's hook; cleared by its step pre-hook
    assert len(seen) == 2 and seen[0][:2] == [None, -1] and seen[1] == []
    assert sorted(map(id, seen[0][2:])) == sorted([id(w), id(b)])
    assert (torch.optim.Optimizer.zero_grad, torch.autograd.backward) == before
    assert not w._post_accumulate_grad_hooks and not b._post_accumulate_grad_hooks
