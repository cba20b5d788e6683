"""The probe's added wall time in each of its islands, inside a real training loop.

The probe's work on the training thread comes in *islands*, each right after torch's heavy
work: the end of ``zero_grad`` (the reset's bookkeeping), the start of the backward (the
marker, the call site and the loss, before the engine runs) and the start of the step (the
step pre-hook's accounting, before the optimizer's kernels). Each island's cost is set by
what it touches cold there, which a hot micro-benchmark misses, so it is timed in the loop:
each training step is cut into six segments at points that exist in the bare loop too,

- ``zero_grad``: the whole ``opt.zero_grad()`` call (its island is at its end);
- ``forward``: the forward and the loss (no island; what follows an island pays for it;
  the last step's loss is dropped here, as a loop rebinding ``loss`` drops it);
- ``backward island``: from ``loss.backward()`` to the engine's first node (a pre-hook on the
  loss's ``grad_fn``, registered in every mode);
- ``backward rest``: the engine (the probe's per-parameter hooks are bound ``list.append``);
- ``step island``: from ``opt.step()`` to a step pre-hook the bench registers after the
  probe's own (so it runs right after it);
- ``step rest``: the optimizer's kernels,

and each mode's segments are set against the bare loop's in the same block: per block the
median of each segment over its steps, the mode's minus the baseline's; the median over
blocks in microseconds, with its standard error (:func:`probe_overhead.median_se`). The
modes are the bare loop, judging only (``norms_every=0``), norms every step and the
probe's *skeleton* (its wrappers and hooks doing nothing: the floor of its shape), in
interleaved blocks whose order rotates, as in ``probe_overhead.py``; the models are its
MLP and 200 x Linear(64, 64). A *rest* segment is the island's after-effect on torch's own
work (caches the probe pushed out), expected near zero.

With ``--previous CHECKOUT`` another checkout's judging and norms run in the same blocks
(:mod:`previous`), so a change to one island is told apart from the machine's spells.

Run: ``python bench/islands.py [--model both|mlp|many] [--blocks N] [--steps N]
[--previous CHECKOUT]``
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

import gradwatch
from gradwatch.probe.nocompile import no_compile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from previous import Previous  # noqa: E402 - a module beside this script
from probe_overhead import (  # noqa: E402 - a module beside this script: the same loop
    Make,
    _many,
    _mlp,
    _positive,
    _se_text,
    _setup,
    median_se,
    per_block,
)

SEGMENTS = ("zero_grad", "forward", "backward island", "backward rest", "step island",
            "step rest")
MODES = ("baseline", "judging", "norms", "skeleton")
"""``skeleton``: the probe's frame with no work in it (:func:`skeleton`)."""
PREVIOUS = ("prev_judging", "prev_norms")
"""With ``--previous``: another checkout's judging and norms (:mod:`previous`)."""


@contextlib.contextmanager
def skeleton(opt: torch.optim.Optimizer) -> Iterator[list[Any]]:
    """The probe's shape doing nothing: the same wrappers of ``Optimizer.zero_grad`` and
    ``torch.autograd.backward`` (each makes one call), a bound ``list.append`` hook on every
    parameter and a step pre-hook behind :func:`~gradwatch.probe.nocompile.no_compile` that
    clears the list. What any probe built this way pays before it does any work. Yields
    the list."""
    hits: list[Any] = []
    zero_grad, backward = torch.optim.Optimizer.zero_grad, torch.autograd.backward

    def wrapped_zero_grad(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = zero_grad(self, *args, **kwargs)
        hits.append(None)
        return out

    def wrapped_backward(*args: Any, **kwargs: Any) -> Any:
        hits.append(-1)
        return backward(*args, **kwargs)

    def pre(*_: Any) -> None:
        hits.clear()

    torch.optim.Optimizer.zero_grad = wrapped_zero_grad  # type: ignore[method-assign]
    torch.autograd.backward = wrapped_backward
    handles = [p.register_post_accumulate_grad_hook(hits.append)
               for group in opt.param_groups for p in group["params"]]
    handles.append(opt.register_step_pre_hook(no_compile(pre)))
    try:
        yield hits
    finally:
        torch.optim.Optimizer.zero_grad = zero_grad  # type: ignore[method-assign]
        torch.autograd.backward = backward
        for h in handles:
            h.remove()


def islands(name: str, make: Make, blocks: int, steps: int, tmp: Path,
            previous: Previous | None = None) -> dict[str, dict[str, tuple[float, float]]]:
    """Per mode (not the baseline) and segment: ``(median us over the baseline, its
    standard error)``, paired by block; and the baseline's own medians (``se`` NaN)."""
    model, x, y, opt = _setup(make)
    loss_fn = torch.nn.functional.cross_entropy
    now = time.perf_counter
    marks = [0.0, 0.0]
    """The engine's start and the step's start, written by the two hooks below."""
    modes = (*MODES, *(PREVIOUS if previous is not None else ()))
    seg: dict[str, list[list[float]]] = {m: [] for m in modes}
    held: list[torch.Tensor | None] = [None]
    """The last step's loss, held until the next forward replaces it, as a loop's ``loss``
    variable is (the probe holds it until the next backward: freed in its island)."""

    def engine_started(_grads: Any) -> None:
        marks[0] = now()

    def step_started(*_: Any) -> None:
        marks[1] = now()

    def step(mode: str | None) -> None:
        t0 = now()
        opt.zero_grad()
        t1 = now()
        loss = held[0] = loss_fn(model(x), y)
        loss.grad_fn.register_prehook(engine_started)
        t2 = now()
        loss.backward()
        t3 = now()
        opt.step()
        t4 = now()
        if mode is not None:
            seg[mode].append([t1 - t0, t2 - t1, marks[0] - t2, t3 - marks[0],
                              marks[1] - t3, t4 - marks[1]])

    def attach(mode: str, b: int) -> Callable[[], None]:
        stack = contextlib.ExitStack()
        if mode == "skeleton":
            stack.enter_context(skeleton(opt))
        elif mode != "baseline":
            gw = gradwatch
            if mode in PREVIOUS and previous is not None:
                gw = stack.enter_context(previous.active())
            handle = gw.watch(opt, log=tmp / f"{name}-{mode}-{b}.jsonl",
                              norms_every=1 if mode.endswith("norms") else 0)
            stack.callback(handle.close)  # (closed first, its modules still in place)
        # after the probe's: step pre-hooks run in the order they were registered
        stack.callback(opt.register_step_pre_hook(step_started).remove)
        return stack.close

    for _ in range(5):
        step(None)
    for b in range(blocks):
        k = b % len(modes)
        for mode in modes[k:] + modes[:k]:  # each mode takes each position alike
            detach = attach(mode, b)
            for _ in range(3):
                step(None)
            for _ in range(steps):
                step(mode)
            detach()
    out: dict[str, dict[str, tuple[float, float]]] = {}
    base = [per_block([s[i] for s in seg["baseline"]], steps) for i in range(len(SEGMENTS))]
    out["baseline"] = {s: (1e6 * statistics.median(base[i]), float("nan"))
                       for i, s in enumerate(SEGMENTS)}
    for mode in modes[1:]:
        out[mode] = {}
        for i, s in enumerate(SEGMENTS):
            mine = per_block([t[i] for t in seg[mode]], steps)
            diff = [1e6 * (m - b) for m, b in zip(mine, base[i], strict=True)]
            out[mode][s] = (statistics.median(diff), median_se(diff)[0])
    return out


def report(name: str, r: dict[str, dict[str, tuple[float, float]]], blocks: int,
           steps: int) -> None:
    print(f"\n{name}: each segment of a step, us ({blocks} blocks of {steps} steps; "
          f"paired by block, +- one standard error of the median)")
    modes = [m for m in r if m != "baseline"]
    print(f"  {'segment':16s} {'baseline':>9s}   " + "   ".join(f"{m:>18s}" for m in modes))
    totals = {m: 0.0 for m in modes}
    for s in SEGMENTS:
        cells = []
        for m in modes:
            v, se = r[m][s]
            totals[m] += v
            cells.append(f"{v:+8.1f} +- {_se_text(se, 1):>5s}")
        print(f"  {s:16s} {r['baseline'][s][0]:9.1f}   " + "   ".join(cells))
    def isl(m: str) -> float:  # (zero_grad's island is at its end: the whole call)
        return sum(r[m][s][0] for s in SEGMENTS if "island" in s or s == "zero_grad")

    print(f"  {'islands':16s} {'':9s}   " + "   ".join(
        f"{isl(m):+8.1f}{'':9s}" for m in modes))
    print(f"  {'sum of segments':16s} {'':9s}   " + "   ".join(
        f"{totals[m]:+8.1f}{'':9s}" for m in modes))
    print(f"  the probe's own work in its islands (judging's minus the skeleton's): "
          f"{isl('judging') - isl('skeleton'):+.1f} us a step")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=("both", "mlp", "many"), default="both")
    ap.add_argument("--blocks", type=_positive, default=None,
                    help="interleaved blocks per model (default: 300 for the MLP, 100 for "
                    "the many-tensor model; about 6 minutes for both)")
    ap.add_argument("--steps", type=_positive, default=10, help="timed steps per block")
    ap.add_argument("--threads", type=_positive, default=1, help="torch intra-op threads")
    ap.add_argument("--previous", type=Path, default=None, metavar="CHECKOUT",
                    help="another checkout (`git worktree add /tmp/prev REV`): its judging "
                    "and norms timed in the same blocks")
    args = ap.parse_args()
    logging.getLogger("gradwatch").setLevel(logging.ERROR)
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); wall clock")
    with tempfile.TemporaryDirectory() as d:
        previous = None if args.previous is None else Previous(args.previous, Path(d))
        if previous is not None:
            print(f"previous: {previous.where}")
        for key, name, make, blocks in (
                ("mlp", "MLP 784-512-512-10, batch 64", _mlp, 300),
                ("many", "200 x Linear(64,64), batch 64", _many, 100)):
            if args.model not in ("both", key):
                continue
            blocks = args.blocks or blocks
            report(name, islands(key, make, blocks, args.steps, Path(d), previous), blocks,
                   args.steps)


if __name__ == "__main__":
    main()
