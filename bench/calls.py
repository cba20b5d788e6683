"""The probe's Python work per judged step, counted: calls, not time (the same on any machine).

A training step (``zero_grad``, forward, backward, ``step``) runs under ``sys.setprofile``,
which sees every Python function the training thread enters (``call``) and every C function
Python code calls (``c_call``). The count per step, with the probe watching minus the bare
loop, is the probe's own work on the training thread; it is split by phase (the four parts
of the step) and, with ``--list``, by function: every Python function the probe adds to one
step, with its count. On the CPU the autograd engine runs the per-parameter hooks on the
calling thread, so they are seen too (the probe's hooks are bound ``list.append``: no
Python frame, and no ``c_call`` either, since the engine calls them from C++).

The steady state is what is counted: after ``--warm`` steps (the session's first backwards
walk the graph, :mod:`gradwatch.probe.reach`, and its first steps check whether the
optimizer ever holds a gradient), ``--steps`` steps, averaged; a sampled graph walk (one
backward in 64) lands in them as a fraction.

The writer thread's work is counted apart, the same way: the calls made while it turns one
step's facts into its record, its line and its verdict (``RecordWriter._emit``), per step
record. It is off the training thread, but on this machine's cores and under the GIL, so a
long run's training thread waits for part of it (``probe_overhead``'s "writer's drains").

Run: ``python bench/calls.py [--steps N] [--warm N] [--list] [--previous CHECKOUT]``
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import torch

import gradwatch
import gradwatch.probe.api  # noqa: F401 - ``run``'s session: gradwatch.probe.api.WatchHandle

sys.path.insert(0, str(Path(__file__).resolve().parent))
from previous import Previous  # noqa: E402 - a module beside this script
from probe_overhead import PHASES, Make, _many, _mlp, _setup  # noqa: E402 - the same loop

MODES = (("judging", 0, False), ("norms", 1, False), ("run", 0, True))
"""``(name, norms_every, gradwatch run's session)``: ``run`` is judging only as ``gradwatch
run`` attaches (global step hooks), where ``judging`` and ``norms`` are ``watch(opt)``'s."""


class Counts:
    """Calls seen per phase, and per Python function (``file:line name``)."""

    def __init__(self) -> None:
        self.phase = 0
        self.py = [0] * len(PHASES)
        self.c = [0] * len(PHASES)
        self.by_fn: collections.Counter[tuple[int, str]] = collections.Counter()

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            self.py[self.phase] += 1
            code = frame.f_code
            self.by_fn[(self.phase, f"{Path(code.co_filename).name}:{code.co_firstlineno} "
                        f"{code.co_qualname}")] += 1
        elif event == "c_call":
            self.c[self.phase] += 1
            self.by_fn[(self.phase, f"[C] {getattr(arg, '__qualname__', arg)}")] += 1


class WriterCounts:
    """Calls the writer thread makes inside ``RecordWriter._emit`` for step facts, after
    the first ``skip`` of them (the warm-up's steps)."""

    _FACTS = ("TextbookStep", "JudgedStep")

    def __init__(self, skip: int) -> None:
        self.skip = skip
        self.seen = self.records = self.py = self.c = 0
        self.by_fn: collections.Counter[str] = collections.Counter()
        self.depth = 0
        """Frames open inside a counted ``_emit`` (0: outside one)."""

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if self.depth:
            if event == "call":
                self.depth += 1
                self.py += 1
                code = frame.f_code
                self.by_fn[f"{Path(code.co_filename).name}:{code.co_firstlineno} "
                           f"{code.co_qualname}"] += 1
            elif event == "return":
                self.depth -= 1
            elif event == "c_call":
                self.c += 1
                self.by_fn[f"[C] {getattr(arg, '__qualname__', arg)}"] += 1
        elif (event == "call" and frame.f_code.co_name == "_emit"
              and type(frame.f_locals.get("item")).__name__ in self._FACTS):
            self.seen += 1
            if self.seen > self.skip:
                self.depth = 1
                self.records += 1

    def per_record(self) -> tuple[float, float]:
        """Python and C calls per counted step record."""
        n = max(1, self.records)
        return self.py / n, self.c / n


def count(make: Make, watch: Callable[[torch.optim.Optimizer], Any] | None, steps: int,
          warm: int) -> tuple[Counts, WriterCounts]:
    """Calls per ``steps`` steps after ``warm`` steps, with ``watch(opt)`` attached (None:
    the bare loop), and the writer thread's per step record."""
    model, x, y, opt = _setup(make)
    loss_fn = torch.nn.functional.cross_entropy
    writer = WriterCounts(skip=warm)
    threading.setprofile(writer.profile)  # for threads started from here: the writer's
    try:
        handle = watch(opt) if watch is not None else None
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]
    counts = Counts()

    def step() -> None:  # the same statements as the bench's loop, phase by phase
        counts.phase = 0
        opt.zero_grad()
        counts.phase = 1
        loss = loss_fn(model(x), y)
        counts.phase = 2
        loss.backward()
        counts.phase = 3
        opt.step()

    for _ in range(warm):
        step()
    sys.setprofile(counts.profile)
    try:
        for _ in range(steps):
            step()
    finally:
        sys.setprofile(None)
    if handle is not None:
        handle.close()  # the writer handles every record before it stops
    return counts, writer


def _watcher(gw: Any, stem: Path, every: int, run: bool
             ) -> Callable[[torch.optim.Optimizer], Any]:
    """``gw.watch`` (this release's or the previous one's) with its own step log; with
    ``run``, ``gradwatch run``'s session instead (no optimizer given: it attaches to each
    optimizer that steps, through torch's global step hooks)."""
    def watch(opt: torch.optim.Optimizer) -> Any:
        log = stem.with_suffix(".jsonl")
        if run:
            return gw.probe.api.WatchHandle([], auto=True, log=log, norms_every=every)
        return gw.watch(opt, log=log, norms_every=every)

    return watch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--warm", type=int, default=20)
    ap.add_argument("--list", action="store_true",
                    help="every function the probe adds to a step, per model and mode")
    ap.add_argument("--previous", type=Path, default=None, metavar="CHECKOUT",
                    help="also count the previous release (a checkout of it)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        previous = None if args.previous is None else Previous(args.previous, tmp)
        releases: list[tuple[str, Callable[[], contextlib.AbstractContextManager[Any]]]] = [
            ("this", contextlib.nullcontext)]
        if previous is not None:
            releases.append(("previous", previous.active))
        print(f"calls per judged step, probe minus bare loop ({args.steps} steps after "
              f"{args.warm}): Python / C, total then by phase ({' / '.join(PHASES)}); "
              f"then the writer thread's per step record")
        for mname, make in (("MLP", _mlp), ("many-tensor", _many)):
            bare, _ = count(make, None, args.steps, args.warm)
            for rel, active in releases:
                for mode, every, run in MODES:
                    with active() as g:
                        c, w = count(make, _watcher(gradwatch if g is None else g,
                                                    tmp / f"{mname}-{rel}-{mode}", every,
                                                    run), args.steps, args.warm)
                    py = [(a - b) / args.steps for a, b in zip(c.py, bare.py, strict=True)]
                    cc = [(a - b) / args.steps for a, b in zip(c.c, bare.c, strict=True)]
                    wpy, wc = w.per_record()
                    print(f"  {mname:12s} {mode:8s} {rel:8s} {sum(py):6.1f} / {sum(cc):6.1f}"
                          f"   ({' / '.join(f'{p:.1f}' for p in py)})"
                          f"   ({' / '.join(f'{p:.1f}' for p in cc)})"
                          f"   writer {wpy:.1f} / {wc:.1f} a record")
                    if args.list and rel == "this":
                        _listing(c, bare, args.steps)
                        _writer_listing(w)


def _listing(c: Counts, bare: Counts, steps: int) -> None:
    print("    the probe's calls per step, by phase (count per step):")
    for ph, name in enumerate(PHASES):
        extra = {fn: (v - bare.by_fn.get((p, fn), 0)) / steps
                 for (p, fn), v in c.by_fn.items() if p == ph}
        for fn, v in sorted(extra.items(), key=lambda kv: (-kv[1], kv[0])):
            if abs(v) >= 0.01:
                print(f"      {name:9s} {v:6.2f}  {fn}")


def _writer_listing(w: WriterCounts) -> None:
    print("    the writer thread's calls per step record (count per record):")
    for fn, v in sorted(w.by_fn.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"      {v / max(1, w.records):6.2f}  {fn}")


if __name__ == "__main__":
    main()
