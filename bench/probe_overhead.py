"""Probe overhead on CPU: median step time without the probe, judging only, norms every step.

Two models: an MLP 784-512-512-10 (batch 64) and a many-tensor model (200 x Linear(64, 64),
400 parameter tensors). The *floor* is the norm kernels alone on the same gradients
(``torch._foreach_norm``), what any reader of the gradients has to pay, timed where a reader
meets them: after the backward, before the step. (Timed right after the step instead, they
cost less: the step has just read the gradients back into the cache. That figure is printed
too, for reference.) Next to it, the probe's own CPU norms alone
(:class:`~gradwatch.probe.cpuplan.CpuPlan`, values read), timed at the same point, and the
floor's kernels with their values read by stacking them.
Modes are measured side by side in interleaved blocks, their order rotating from block to
block, so drift in machine speed hits all of them alike; the floor is a mode of its own, so
the baseline's steps run with nothing between them. Targets: judging <= 1.01x baseline
(MLP), <= 1.03x (many-tensor); norms every step <= baseline + 1.0 x floor. Beside judging,
the same with the loss capture off (what recording each step's loss costs), and with
``--previous CHECKOUT`` the previous release's judging and norms in the same blocks
(:mod:`previous`).

Figures are printed twice from the same run: wall-clock time and process CPU time; each
also as a paired estimate (the cost block by block, then the median over blocks), which a
slow spell of a shared machine disturbs least, with its standard error from the blocks'
spread: how finely one run resolves the cost against its target. On this project's shared
2-core machine single blocks disagree by several floors, so the defaults (800 blocks of
the MLP, 300 of the many-tensor model) are what brings that error to about 0.1 x floor
(200 and 100 blocks left it at 0.15 to 0.44: see README, Benchmarks).

Apart from the targets, long blocks measure what the probe's writer thread costs the
training thread: its drains hold the GIL, and the training thread waits for it.

Run: ``python bench/probe_overhead.py [--model both|mlp|many] [--blocks N] [--steps N]
[--threads N] [--wait-blocks N] [--wait-seconds S] [--previous CHECKOUT]``
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.hooks import RemovableHandle

import gradwatch
from gradwatch.probe import reach
from gradwatch.probe.cpuplan import CpuPlan
from gradwatch.probe.writer import RecordWriter

sys.path.insert(0, str(Path(__file__).resolve().parent))
from previous import Previous  # noqa: E402 - a module beside this script


def _mlp() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    m = torch.nn.Sequential(torch.nn.Linear(784, 512), torch.nn.ReLU(),
                            torch.nn.Linear(512, 512), torch.nn.ReLU(),
                            torch.nn.Linear(512, 10))
    return m, torch.randn(64, 784), torch.randint(0, 10, (64,))


def _many() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    m = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(200)])
    return m, torch.randn(64, 64), torch.randint(0, 64, (64,))


MODES = ("baseline", "judging", "norms", "noloss", "unwritten", "hooks", "reader")
"""``noloss`` is judging with the loss capture off (the learning rate still read): beside
judging, what recording each step's loss costs.
``unwritten``, ``hooks`` and ``reader`` take the cost apart (no targets): ``unwritten``
is norms every step with the records dropped instead of handed to the writer thread
(which drains every 0.1 s after the watch starts: the report says how many blocks' timed
steps saw a drain; the MLP's blocks mostly end before the first, the many-tensor model's span
several; :func:`writer_waits` measures the writer's cost apart, in long blocks);
``hooks`` is a no-op Python post-accumulate-grad hook on every parameter, what a tracker
with a Python hook per parameter pays (the probe's hooks are bound ``list.append``, with no
Python frame; the engine's call into Python is most of either's cost);
``reader`` is a bare step pre-hook running the floor's kernels where the step reads the
gradients, inside a whole training step, and keeping the values (read at once, stacked in
one copy)."""
PREVIOUS = ("prev_judging", "prev_norms")
"""With ``--previous``: the previous release's judging and norms every step."""

Clock = Callable[[], float]
CLOCKS: dict[str, Clock] = {"wall": time.perf_counter, "cpu": time.process_time}
"""``cpu`` is the whole process's CPU time (training thread, writer thread, torch threads):
on a shared machine it is far steadier than wall time."""


Make = Callable[[], tuple[torch.nn.Module, torch.Tensor, torch.Tensor]]


def _setup(make: Make) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor,
                                torch.optim.Optimizer]:
    """The model, its batch and its optimizer, the same in every measurement."""
    torch.manual_seed(0)
    model, x, y = make()
    return model, x, y, torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)


def bench(name: str, make: Make, blocks: int, steps: int, tmp: Path,
          previous: Previous | None = None) -> dict[str, dict[str, float]]:
    model, x, y, opt = _setup(make)
    params = list(model.parameters())
    loss_fn = torch.nn.functional.cross_entropy
    timed_modes = (*MODES, *(PREVIOUS if previous is not None else ()))
    modes = (*timed_modes, "floor", "stacked", "kernels", "floor_after_step", "walk")
    times: dict[str, dict[str, list[float]]] = {c: {m: [] for m in modes} for c in CLOCKS}
    phases: dict[str, list[list[float]]] = {m: [] for m in timed_modes}
    """Wall time of each phase of each timed step (:data:`PHASES`)."""
    drained: dict[str, list[bool]] = {"judging": [], "norms": []}
    """Per block: whether the writer thread wrote records while the timed steps ran."""
    now = time.perf_counter

    def step(mode: str | None = None) -> None:
        t0 = now()
        opt.zero_grad()
        t1 = now()
        loss = loss_fn(model(x), y)
        t2 = now()
        loss.backward()
        t3 = now()
        opt.step()
        if mode is not None:  # (the same four clock reads in every mode)
            phases[mode].append([t1 - t0, t2 - t1, t3 - t2, now() - t3])

    def timed(mode: str, fn: Callable[[], object]) -> None:
        t = [c() for c in CLOCKS.values()]
        fn()
        for (c, clock), t0 in zip(CLOCKS.items(), t, strict=True):
            times[c][mode].append(clock() - t0)

    def norms_of(grads: list[torch.Tensor | None]) -> tuple[torch.Tensor, ...]:
        return torch._foreach_norm([g for g in grads if g is not None])

    def floor() -> None:  # the norm kernels alone, on these same gradients
        norms_of([p.grad for p in params])

    def stacked() -> list[float]:  # the floor's kernels, their values read to the host
        return torch.stack(norms_of([p.grad for p in params])).tolist()  # in one copy

    plans: list[CpuPlan | None] = []

    def kernels() -> None:  # the probe's own CPU norms, alone, on these same gradients
        grads = [p.grad for p in params]
        if not plans:
            plans.append(CpuPlan.make(grads))
        plan = plans[0]
        assert plan is not None and not plan.failed
        plan.read(grads)

    kept: list[list[float]] = []

    def reader(*_: object) -> None:  # the same kernels where the step reads the gradients,
        kept.append(stacked())  # values kept
        if len(kept) > 32:
            kept.clear()

    def attach(mode: str, b: int) -> tuple[Callable[[], None], RecordWriter | None]:
        """Start ``mode``; returns how to stop it, and its watch's writer (None without a
        watch)."""
        if mode in PREVIOUS and previous is not None:
            stack = contextlib.ExitStack()
            old = stack.enter_context(previous.active())
            handle = old.watch(opt, log=tmp / f"{name}-{mode}-{b}.jsonl",
                               norms_every=0 if mode == "prev_judging" else 1)
            stack.callback(handle.close)  # closed first, its modules still in place
            return stack.close, handle.writer
        if mode in ("judging", "norms", "noloss", "unwritten"):
            handle = gradwatch.watch(opt, log=tmp / f"{name}-{mode}-{b}.jsonl",
                                     norms_every=1 if mode in ("norms", "unwritten") else 0)
            if mode == "unwritten":
                handle.tracker.emit = lambda _record: None
            if mode == "noloss":
                handle.tracker.roots.on = False
            return handle.close, handle.writer
        hs: list[RemovableHandle] = []
        if mode == "hooks":
            hs = [p.register_post_accumulate_grad_hook(lambda _p: None) for p in params]
        elif mode == "reader":
            hs = [opt.register_step_pre_hook(reader)]

        def detach() -> None:
            for h in hs:
                h.remove()

        return detach, None

    def reads() -> None:
        """The floor's own block: each kernel timed first thing after the backward, where
        the step (and the probe) would read the gradients; then, for reference, the floor
        again right after the step."""
        for what, fn in (("floor", floor), ("stacked", stacked), ("kernels", kernels)):
            for _ in range(steps):
                opt.zero_grad()
                loss_fn(model(x), y).backward()
                timed(what, fn)
                opt.step()
                if what == "floor":
                    timed("floor_after_step", floor)

    rotation = (*timed_modes, "floor")
    for _ in range(5):
        step()
    for b in range(blocks):
        for mode in rotation[b % len(rotation):] + rotation[:b % len(rotation)]:
            if mode == "floor":  # (each mode takes each position alike)
                reads()
                continue
            detach, writer = attach(mode, b)
            for _ in range(3):
                step()
            w0 = writer.written if writer is not None else 0
            for _ in range(steps):
                timed(mode, functools.partial(step, mode))
            if writer is not None and mode in drained:
                drained[mode].append(writer.written > w0)
            detach()
            kept.clear()
    for _ in range(steps):  # the graph walk a session's first backwards and 1 in 64 get
        loss = loss_fn(model(x), y)
        timed("walk", functools.partial(reach.leaves, [loss]))
        del loss
    out = {c: {m: statistics.median(v) * 1e3 for m, v in t.items()} for c, t in times.items()}
    for c, t in times.items():
        out[c].update(paired(t, steps))
    out["wall"].update(by_phase(phases, steps))
    for c in CLOCKS:
        out[c].update({f"drained_{m}": sum(v) / len(v) for m, v in drained.items()})
    return out


def writer_waits(make: Make, blocks: int, seconds: float, tmp: Path) -> dict[str, float]:
    """The training thread's time off the CPU per step, mostly waits for the GIL, with
    norms every step: records written (the writer thread drains every 0.1 s) and records
    dropped (no writer work). The interleaved blocks of :func:`bench` see its drains or
    not depending on the model (the MLP's mostly end before the first), and medians would hide
    most of them: these blocks last ``seconds`` each, alternating, and report means
    (microseconds)."""
    model, x, y, opt = _setup(make)
    loss_fn = torch.nn.functional.cross_entropy
    off: dict[str, list[float]] = {"written": [], "dropped": []}
    wall, cpu = time.perf_counter, time.thread_time

    def step() -> None:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()

    for b in range(2 * blocks):
        mode = ("written", "dropped")[b % 2]
        handle = gradwatch.watch(opt, log=tmp / f"waits-{mode}-{b}.jsonl")
        if mode == "dropped":
            handle.tracker.emit = lambda _record: None
        for _ in range(3):
            step()
        n, w0, c0 = 0, wall(), cpu()
        while wall() - w0 < seconds:
            step()
            n += 1
        off[mode].append(((wall() - w0) - (cpu() - c0)) / n * 1e6)
        handle.close()
    return {m: statistics.mean(v) for m, v in off.items()}


PHASES = ("zero_grad", "forward", "backward", "step")
NORMS_TARGET = 1.0
"""Norms every step: at most baseline + this many times the floor."""


def per_block(v: list[float], steps: int) -> list[float]:
    """The median of each block of ``steps`` consecutive timings."""
    return [statistics.median(v[i:i + steps]) for i in range(0, len(v), steps)]


def by_phase(phases: dict[str, list[list[float]]], steps: int) -> dict[str, float]:
    """Where each mode's cost falls: per phase, the block's median over the baseline's,
    then the median over blocks (microseconds)."""
    out = {}
    for i, ph in enumerate(PHASES):
        base = per_block([s[i] for s in phases["baseline"]], steps)
        for m in [m for m in phases if m != "baseline"]:
            mine = per_block([s[i] for s in phases[m]], steps)
            out[f"phase_{m}_{ph}"] = 1e6 * statistics.median(
                x - b for x, b in zip(mine, base, strict=True))
    return out


def paired(t: dict[str, list[float]], steps: int) -> dict[str, float]:
    """The probe's cost block by block (a block's modes run within a second of each other,
    so a slow spell of a shared machine hits them alike), then the median over blocks."""
    blocks = {m: per_block(v, steps) for m, v in t.items()}
    base, floor = blocks["baseline"], blocks["floor"]
    out = {}
    for m in ("judging", "noloss", "prev_judging"):
        if m in blocks:
            ratio = [j / b for j, b in zip(blocks[m], base, strict=True)]
            out[f"paired_{m}"] = statistics.median(ratio)
            out[f"paired_{m}_se"] = median_se(ratio)[0]
    for m in ("norms", "unwritten", "hooks", "reader", "prev_norms"):
        if m not in blocks:
            continue
        per = [(x - b) / f for x, b, f in zip(blocks[m], base, floor, strict=True)]
        out[f"paired_{m}"] = statistics.median(per)
        if m in ("norms", "prev_norms"):  # how much the blocks disagree: the middle half
            se, q1, q3 = median_se(per)
            out[f"paired_{m}_se"], out[f"paired_{m}_q1"], out[f"paired_{m}_q3"] = se, q1, q3
    return out


def median_se(per: list[float]) -> tuple[float, float, float]:
    """The standard error of the median of per-block figures, from their spread (the
    middle half of the blocks, ``q1`` to ``q3``, as a normal's: sd = IQR / 1.349, and the
    median's error 1.2533 sd / sqrt(blocks)); returns ``(se, q1, q3)``. It is what one run
    can resolve: a cost within about two of them of its target is not told apart from it.
    It counts the sampling within the run only; whole runs have differed by more (README,
    Benchmarks)."""
    if len(per) < 2:
        return math.nan, per[0], per[0]
    q1, _, q3 = statistics.quantiles(per, n=4)
    return 1.2533 * (q3 - q1) / 1.349 / math.sqrt(len(per)), q1, q3


def _se_text(se: float, digits: int) -> str:
    """A standard error for the report; ``n/a`` for one block, which has no spread."""
    return "n/a" if math.isnan(se) else f"{se:.{digits}f}"


def report_waits(w: dict[str, float], floor_ms: float) -> None:
    extra = w["written"] - w["dropped"]
    print(f"  the writer's drains, long blocks (means): the training thread waits off the CPU "
          f"{w['written']:.1f} us a step with records written, {w['dropped']:.1f} with them "
          f"dropped: {extra:+.1f} us = {extra / (floor_ms * 1e3):+.2f} x floor")


def report(name: str, target: float, r: dict[str, float], clock: str, blocks: int) -> None:
    base, judging, norms, floor = r["baseline"], r["judging"], r["norms"], r["floor"]
    budget = base + NORMS_TARGET * floor
    print(f"\n{name}: median step, ms ({clock} clock, {blocks} blocks)")
    print(f"  baseline             {base:8.3f}")
    print(f"  judging only         {judging:8.3f}   x{judging / base:.3f}   "
          f"(target <= x{target:.2f}: {'ok' if judging <= target * base else 'MISS'})")
    print(f"  norms every step     {norms:8.3f}   x{norms / base:.3f}   "
          f"(target <= baseline + {NORMS_TARGET:.1f} x floor = {budget:.3f}: "
          f"{'ok' if norms <= budget else 'MISS'})")
    print(f"  floor (norms alone)  {floor:8.3f}   "
          f"probe cost with norms = {(norms - base) / floor:.2f} x floor")
    after = r["floor_after_step"]
    print(f"  for reference, the floor's kernels right after the step (gradients warm) "
          f"{after:.3f} = {after / floor:.2f} x floor; against it, norms every step = "
          f"baseline + {(norms - base) / after:.2f} x that")
    print(f"  the probe's own norm kernels alone (CpuPlan, values read) {r['kernels']:.3f}"
          f" = {r['kernels'] / floor:.2f} x floor; the floor's kernels with their values "
          f"read by stacking them (the bare reader's way) {r['stacked']:.3f} = "
          f"{r['stacked'] / floor:.2f} x floor")
    print(f"  a sampled walk of the autograd graph (a session's first {reach.FIRST} backwards, "
          f"then 1 in {reach.EVERY}): {r['walk']:.3f} ms = {r['walk'] / floor:.2f} x floor, "
          f"{r['walk'] / reach.EVERY * 1e3:.1f} us a step in the long run")
    print(f"  paired by block      judging x{r['paired_judging']:.3f} "
          f"(+-{_se_text(r['paired_judging_se'], 3)}), norms every step = baseline + "
          f"{r['paired_norms']:.2f} +- {_se_text(r['paired_norms_se'], 2)} x floor "
          f"(+- one standard error of the median, from the blocks' spread: the middle half "
          f"of blocks {r['paired_norms_q1']:.2f} to {r['paired_norms_q3']:.2f})")
    print(f"  loss capture off     judging x{r['paired_noloss']:.3f} "
          f"(+-{_se_text(r['paired_noloss_se'], 3)}), paired; median step {r['noloss']:.3f}"
          f" = x{r['noloss'] / base:.3f}: the loss capture costs "
          f"{(r['paired_judging'] - r['paired_noloss']) * base * 1e3:+.1f} us a step")
    if "paired_prev_judging" in r:
        print(f"  previous release     judging x{r['paired_prev_judging']:.3f} "
              f"(+-{_se_text(r['paired_prev_judging_se'], 3)}), norms every step = "
              f"baseline + {r['paired_prev_norms']:.2f} +- "
              f"{_se_text(r['paired_prev_norms_se'], 2)} x floor (paired; median steps "
              f"x{r['prev_judging'] / base:.3f}, "
              f"{(r['prev_norms'] - base) / floor:+.2f} x floor)")
    hooks, reader, unwritten = r["paired_hooks"], r["paired_reader"], r["paired_unwritten"]
    print(f"  the writer thread drained during the timed steps of "
          f"{r['drained_norms']:.0%} of the blocks with norms every step "
          f"({r['drained_judging']:.0%} with judging only); long blocks measure its "
          f"waits apart")
    print(f"  taken apart (paired, x floor): bare reader in place (the floor's kernels) "
          f"{reader:.2f}, the probe's training-thread work beyond it {unwritten - reader:.2f}"
          f", handing records to the writer {r['paired_norms'] - unwritten:.2f}; for scale, "
          f"a no-op Python hook on every parameter {hooks:.2f}")
    if "phase_norms_step" in r:
        print(f"  by phase (paired, us over the baseline: {' / '.join(PHASES)}):")
        for m, label in (("hooks", "no-op hooks"), ("reader", "bare reader"),
                         ("judging", "judging only"), ("noloss", "judging, no loss"),
                         ("unwritten", "norms, unwritten"), ("norms", "norms every step"),
                         ("prev_judging", "previous, judging"),
                         ("prev_norms", "previous, norms")):
            if f"phase_{m}_step" not in r:
                continue
            cells = " / ".join(f"{r[f'phase_{m}_{ph}']:+6.1f}" for ph in PHASES)
            print(f"    {label:18s} {cells}")


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {n}")
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=_positive, default=None,
                    help="interleaved blocks per model (default: 800 for the MLP, "
                    "300 for the many-tensor model, whose steps take 5 times as long; "
                    "about 20 to 25 minutes for both)")
    ap.add_argument("--model", choices=("both", "mlp", "many"), default="both",
                    help="which model to measure (default: both)")
    ap.add_argument("--steps", type=_positive, default=10)
    ap.add_argument("--threads", type=_positive, default=1, help="torch intra-op threads")
    ap.add_argument("--wait-blocks", type=_positive, default=4,
                    help="blocks of each kind for the writer's waits")
    ap.add_argument("--wait-seconds", type=float, default=1.0,
                    help="seconds per block for the writer's waits")
    ap.add_argument("--previous", type=Path, default=None, metavar="CHECKOUT",
                    help="a checkout of the previous release (`git worktree add /tmp/prev "
                    "REV`): its judging and norms are timed in the same blocks")
    args = ap.parse_args()
    logging.getLogger("gradwatch").setLevel(logging.ERROR)
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
          f"interleaved blocks of {args.steps} steps per mode")
    with tempfile.TemporaryDirectory() as d:
        previous = None if args.previous is None else Previous(args.previous, Path(d))
        if previous is not None:
            print(f"previous release: {previous.where}")
        for key, name, make, target, blocks in (
                ("mlp", "MLP 784-512-512-10, batch 64", _mlp, 1.01, 800),
                ("many", "200 x Linear(64,64), batch 64", _many, 1.03, 300)):
            if args.model not in ("both", key):
                continue
            blocks = args.blocks or blocks
            r = bench(name.split()[0], make, blocks, args.steps, Path(d), previous)
            w = writer_waits(make, args.wait_blocks, args.wait_seconds, Path(d))
            for clock in CLOCKS:
                report(name, target, r[clock], clock, blocks)
                if clock == "wall":
                    report_waits(w, r[clock]["floor"])


if __name__ == "__main__":
    main()
