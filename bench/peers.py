"""The peers side by side: what watching gradients every step costs a training step, and
what each tool writes per step, for wandb, TensorBoard, Lightning and gradwatch.

The same two CPU models and loop as ``bench/probe_overhead.py`` (its builders are imported):
an MLP 784-512-512-10 and 200 x Linear(64, 64), batch 64, SGD with momentum, one torch
thread. Each tool is a mode, watching every step:

- ``wandb``: ``run.watch(model, log="gradients", log_freq=1)`` in an offline run, each step
  committed with ``run.log({})`` (a loop that logs anything does that; without a commit the
  watch's histograms wait in the pending row and only the last is written);
- ``tensorboard``: ``SummaryWriter.add_histogram`` of every gradient and ``add_scalar`` of
  their total norm, after the backward;
- ``lightning``: ``grad_norm(model, norm_type=2)`` after the backward (where its docs call it,
  in ``on_before_optimizer_step``), the values read to the host as a logger reads them;
- ``judging`` and ``norms``: ``gradwatch.watch(opt, log=..., norms_every=0 | 1)``.

Each is timed against the bare loop in interleaved blocks whose order rotates from block to
block; per block the mode's median step over the baseline's, then the median over blocks with
its standard error (``probe_overhead.median_se``). Bytes per step are measured apart, in fresh
sessions of two lengths: the difference in what they left on disk over the difference in steps.
wandb and TensorBoard are installed on demand into the running environment, pinned, and never
by the test suite; the bench refuses to go on if installing them changed torch.

Run: ``python bench/peers.py [--model both|mlp|many] [--blocks N] [--only TOOL,...] [--quick]``
"""

from __future__ import annotations

import os

# numpy's OpenBLAS keeps its idle worker threads spinning on the other core for a while after
# a call (TensorBoard's histograms make one per gradient), which would bill the modes after
# it: set before torch loads numpy, so every mode computes on one core, as torch does.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import functools  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from peer_tools import (  # noqa: E402
    LABELS,
    TOOLS,
    WRITES_NOTHING,
    Tool,
    child_cpu_seconds,
    ensure_installed,
    make_tool,
    modes_of,
)
from probe_overhead import (  # noqa: E402
    CLOCKS,
    _many,
    _mlp,
    _positive,
    _se_text,
    _setup,
    median_se,
    per_block,
)

MODELS = {  # key: (name at batch 64, builder, default blocks, timed steps per block,
    #             untimed steps after each attach)
    "mlp": ("MLP 784-512-512-10", _mlp, 200, 10, 3),
    "many": ("200 x Linear(64,64)", _many, 80, 5, 2),
}
"""The many-tensor model's steps take about five times as long: fewer, shorter blocks keep
both within about 8 to 12 minutes with every tool, as the machine's load goes."""
EARLIER = {"wandb": ("x4.97", "x13.1"), "tensorboard": ("x11.5", "x29.5"),
           "lightning": ("x1.14", "x1.17")}
"""One-off figures measured before this bench, on the same kind of machine."""


Hook = Callable[[], None]


def _step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
          opt: torch.optim.Optimizer, between: Hook | None, after: Hook | None) -> None:
    """One training step, the same in every mode; the tool's calls where it makes them."""
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    if between is not None:  # where a reader meets the gradients: before the step
        between()
    opt.step()
    if after is not None:
        after()


@dataclass
class Timings:
    """One model's timing run: per clock and mode, every timed step (seconds)."""

    times: dict[str, dict[str, list[float]]]
    steps: int
    blocks: int
    watched_steps: dict[str, int]
    """Per mode, the steps it watched: timed and untimed."""
    wandb_core_cpu: float | None
    """CPU seconds of wandb's service process over the run (None: not measured)."""
    disk: dict[str, int]
    """Per mode, the bytes it left on disk by the end of the run."""
    seconds: float

    def paired(self, clock: str, mode: str) -> tuple[float, float, float, float]:
        """Per block the mode's median step over the baseline's, then the median over blocks;
        returns ``(ratio, se, q1, q3)``."""
        base = per_block(self.times[clock]["baseline"], self.steps)
        mine = per_block(self.times[clock][mode], self.steps)
        per = [m / b for m, b in zip(mine, base, strict=True)]
        se, q1, q3 = median_se(per)
        return statistics.median(per), se, q1, q3

    def median_ms(self, clock: str, mode: str) -> float:
        return statistics.median(self.times[clock][mode]) * 1e3


def timing(make: Callable, modes: list[str], blocks: int, steps: int, warm: int,
           out: Path) -> Timings:
    """Interleaved blocks: each runs every mode once, in an order rotating from block to
    block; a mode attaches, runs ``warm`` untimed steps, ``steps`` timed ones, detaches."""
    model, x, y, opt = _setup(make)
    step = functools.partial(_step, model, x, y, opt)
    tools: dict[str, Tool] = {m: make_tool(m, model, opt, out / m) for m in modes}
    times: dict[str, dict[str, list[float]]] = {
        c: {m: [] for m in ("baseline", *modes)} for c in CLOCKS}
    watched = dict.fromkeys(modes, 0)
    started, cpu0 = time.perf_counter(), child_cpu_seconds()

    def timed(mode: str, fn: Callable[[], None]) -> None:
        t = [c() for c in CLOCKS.values()]
        fn()
        for (c, clock), t0 in zip(CLOCKS.items(), t, strict=True):
            times[c][mode].append(clock() - t0)

    for _ in range(5):
        step(None, None)
    rotation = ("baseline", *modes)
    for b in range(blocks):
        for mode in rotation[b % len(rotation):] + rotation[:b % len(rotation)]:
            tool = tools.get(mode)
            if tool is not None:
                tool.start(b)
            between, after = _hook(tool, "between"), _hook(tool, "after")
            for _ in range(warm):
                step(between, after)
            for _ in range(steps):
                timed(mode, functools.partial(step, between, after))
            if tool is not None:
                tool.stop()  # flushes what it queued, untimed, before the next mode runs
                watched[mode] += warm + steps
        print(f"  block {b + 1}/{blocks}", end="\r", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    for tool in tools.values():
        tool.finish()
    cpu = child_cpu_seconds()
    wandb_cpu = None if "wandb" not in modes or cpu is None or cpu0 is None else cpu - cpu0
    disk = {m: _size(out / m) for m in modes}
    return Timings(times, steps, blocks, watched, wandb_cpu, disk,
                   time.perf_counter() - started)


def _size(d: Path) -> int:
    return sum(f.stat().st_size for f in d.rglob("*") if f.is_file())


def _hook(tool: Tool | None, point: str) -> Hook | None:
    """The tool's call at ``point`` of a step, None where it does nothing there (so the loop
    makes no call at all, as the baseline's)."""
    if tool is None or getattr(type(tool), point) is getattr(Tool, point):
        return None
    return getattr(tool, point)


def bytes_per_step(make: Callable, mode: str, short: int, long: int,
                   out: Path) -> tuple[float, int]:
    """What ``mode`` leaves on disk per step: fresh sessions of ``short`` and ``long`` steps,
    each finished (everything flushed); the difference in bytes over the difference in
    steps. Returns ``(bytes per step, bytes of the short session)``."""
    sizes = []
    for n in (short, long):
        model, x, y, opt = _setup(make)
        d = out / f"{mode}-{n}"
        tool = make_tool(mode, model, opt, d)
        tool.start(0)
        for _ in range(n):
            _step(model, x, y, opt, tool.between, tool.after)
        tool.stop()
        tool.finish()
        sizes.append(_size(d))
        shutil.rmtree(d)
    return (sizes[1] - sizes[0]) / (long - short), sizes[0]


def _disk_check(per_step: dict[str, float], watched: int, out: Path) -> None:
    """Refuse a run whose outputs would fill the disk (wandb's histograms are the risk)."""
    need = sum(per_step.values()) * watched
    free = shutil.disk_usage(out).free
    if need > free / 2:
        sys.exit(f"peers: the timing run would write about {need / 1e9:.1f} GB into {out} "
                 f"({free / 1e9:.1f} GB free); run fewer --blocks")


def _fmt_bytes(b: float | None) -> str:
    if b is None:
        return "nothing"
    return f"{b / 1e6:.2f} MB" if b >= 1e6 else f"{b / 1e3:.1f} kB" if b >= 1e4 else f"{b:.0f} B"


Results = dict[str, tuple[Timings, dict[str, float | None]]]
"""Per model key: its timings and each mode's bytes per step (None: writes nothing)."""


def report(results: Results, modes: list[str], clock: str) -> None:
    """The comparison table on one clock: ratio +- SE and bytes per step, per model."""
    print(f"\n{clock} clock: step time monitored / unmonitored, paired by block (median over "
          f"blocks +- one standard error); bytes written per step")
    print(f"  {'':50s}" + "".join(f" | {MODELS[k][0]:26s}" for k in results))
    print(f"  {'tool':50s}" + " | ratio +- SE     bytes/step" * len(results))
    cells = [f" | {t.median_ms(clock, 'baseline'):7.3f} ms step {'':10s}"
             for t, _ in results.values()]
    print(f"  {'unmonitored (median step)':50s}" + "".join(cells))
    for mode in modes:
        row = ""
        for t, written in results.values():
            r, se, _, _ = t.paired(clock, mode)
            row += f" | x{r:6.3f} +- {_se_text(se, 3):5s} {_fmt_bytes(written[mode]):>10s}"
        print(f"  {LABELS[mode]:50s}{row}")


def report_details(results: Results, modes: list[str]) -> None:
    """Spread, headline figures, earlier figures and wandb's service CPU (wall clock)."""
    print("\nwall clock, per model and mode: the middle half of the blocks' ratios; the "
          "headline (median of all steps over the baseline's); earlier one-off figures")
    for k, (t, _) in results.items():
        left = ", ".join(f"{m} {_fmt_bytes(b)}" for m, b in t.disk.items() if b)
        print(f"  {MODELS[k][0]}, batch 64: {t.blocks} blocks of {t.steps} timed steps per mode, "
              f"{t.seconds:.0f} s; left on disk: {left or 'nothing'}")
        for mode in modes:
            r, _, q1, q3 = t.paired("wall", mode)
            head = t.median_ms("wall", mode) / t.median_ms("wall", "baseline")
            earlier = EARLIER.get(mode, ("", ""))[0 if k == "mlp" else 1]
            print(f"    {mode:12s} blocks x{q1:.3f} to x{q3:.3f}, headline x{head:.3f}"
                  + (f", earlier one-off {earlier}" if earlier else ""))
        if t.wandb_core_cpu is not None:
            per = t.wandb_core_cpu / t.watched_steps["wandb"] * 1e3
            print(f"    wandb's service process, another process (so in neither clock): "
                  f"{per:.2f} ms CPU per watched step")
    for mode, why in WRITES_NOTHING.items():
        if mode in modes:
            print(f"  {why}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=("both", "mlp", "many"), default="both")
    ap.add_argument("--blocks", type=_positive, default=None,
                    help="interleaved blocks per model (default: "
                    + ", ".join(f"{v[2]} for {k}" for k, v in MODELS.items())
                    + "; about 8 to 12 minutes for both)")
    ap.add_argument("--only", default=",".join(TOOLS),
                    help=f"comma-separated tools to measure (default: {','.join(TOOLS)})")
    ap.add_argument("--quick", action="store_true",
                    help="2 blocks of 3 steps, bytes over 2 and 4 steps: a look, no figures")
    ap.add_argument("--threads", type=_positive, default=1, help="torch intra-op threads")
    args = ap.parse_args()
    only = [t.strip() for t in args.only.split(",") if t.strip()]
    unknown = sorted(set(only) - set(TOOLS))
    if unknown or not only:
        ap.error(f"--only takes tools from {', '.join(TOOLS)}; got {args.only!r}")
    versions = ensure_installed(only)
    modes = modes_of(only)
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
          f"OPENBLAS_NUM_THREADS={os.environ['OPENBLAS_NUM_THREADS']}; "
          + ", ".join(f"{k} {v}" for k, v in versions.items()))
    print("command: python " + " ".join(sys.argv))
    started = time.perf_counter()
    results: Results = {}
    with tempfile.TemporaryDirectory(prefix="gradwatch-peers-") as d:
        os.environ.update(WANDB_MODE="offline", WANDB_DIR=d, WANDB_SILENT="true")
        for key, (name, make, blocks, steps, warm) in MODELS.items():
            if args.model not in ("both", key):
                continue
            if args.quick:
                blocks, steps, warm = 2, 3, 1
            blocks = args.blocks or blocks
            short, long = (2, 4) if args.quick else (5, 25)
            written: dict[str, float | None] = {}
            for mode in modes:
                if mode in WRITES_NOTHING:
                    written[mode] = None
                    continue
                per, first = bytes_per_step(make, mode, short, long, Path(d))
                written[mode] = per
                print(f"{name}, batch 64: {mode} writes {_fmt_bytes(per)} a step "
                      f"({_fmt_bytes(first)} after {short} steps)", file=sys.stderr)
            _disk_check({m: v for m, v in written.items() if v}, blocks * (steps + warm),
                        Path(d))
            print(f"{name}, batch 64: timing {blocks} blocks", file=sys.stderr)
            t = timing(make, modes, blocks, steps, warm, Path(d) / key)
            shutil.rmtree(Path(d) / key)  # (wandb's part can be large; its size is kept)
            results[key] = (t, written)
    for clock in CLOCKS:
        report(results, modes, clock)
    report_details(results, modes)
    print(f"\ntook {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
