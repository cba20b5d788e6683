"""What a long run costs to keep: bytes per step of the step log, and whether reading a log
needs memory in proportion to its length.

Trains a 20-tensor model (10 × Linear(16, 16), SGD) under ``gradwatch.watch`` for 1,000 and
10,000 clean steps with norms every step, writing plain and compressed (``.gz``) step logs,
and prints:

- bytes per step of the step log (plain, gzip), and of the same records as the version-1
  writer wrote them, for comparison;
- the peak memory (max RSS) of ``gradwatch check`` and of a replay's reading (its validating
  pass, then its sending pass into a spool, without a server) on each log, each in a fresh
  subprocess, and its growth from the 1k- to the 10k-step log; the whole-log reader
  (``steplog.read_log``) beside them for reference;
- the reader's records per second over the 10k-step log.

The server's part (data directory bytes per step after import, import records per second,
a million-step run) is ``bench/storage_server.py``.

Run: ``python bench/storage.py [--steps N] [--small N]``
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

LOG_BYTES_TARGET = 350
"""Bytes per step of the step log (plain) at most."""
GROWTH_TARGET_MB = 25.0
"""Peak memory a reader may gain from the 1k- to the 10k-step log, at most."""


@dataclass
class Figure:
    """One row of the printed table."""

    name: str
    value: str
    target: str = ""
    ok: bool | None = None


def train(path: Path, steps: int) -> None:
    """``steps`` clean steps of the 20-tensor model under watch, logged to ``path``."""
    import torch

    import gradwatch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(10)])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(8, 16)
    with gradwatch.watch(opt, model=model, log=path, run_name=f"storage {steps}"):
        for _ in range(steps):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()


def v1_bytes(path: Path) -> int:
    """The bytes the version-1 writer wrote for the records of ``path`` (every field, lists
    of 17-digit floats; without the step fields version 2 added)."""
    from gradwatch.steplog import LogReader
    from gradwatch.wire import Step

    with LogReader(path) as reader:
        total = len(reader.header.model_copy(update={"v": 1}).model_dump_json()) + 1
        for r in reader:
            text = (r.model_dump_json(exclude={"loss", "lr"}) if isinstance(r, Step)
                    else r.model_dump_json())
            total += len(text) + 1
    return total


# Each reader runs in a fresh interpreter that prints its own peak RSS (KiB) last: VmHWM,
# which exec resets (ru_maxrss would keep this process's peak, inherited through fork).
_PEAK = """
def peak_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
"""
_CHECK = _PEAK + """
import contextlib, io, sys
from gradwatch import check
with contextlib.redirect_stdout(io.StringIO()):
    check.main([sys.argv[1]])
print(peak_kib())
"""
_REPLAY = _PEAK + """
import sys, tempfile, time
from itertools import chain
from pathlib import Path
from gradwatch.replay import retimed, validating_pass
from gradwatch.steplog import LogReader, StepLogWriter
header, n, last, warnings = validating_pass(sys.argv[1])
with tempfile.TemporaryDirectory() as d, LogReader(sys.argv[1]) as reader, \\
        StepLogWriter(Path(d) / "spool.jsonl") as spool:
    for _, rec in retimed(chain([reader.header], reader), header.t, time.time(), None,
                          "bench-replay", "bench"):
        spool.write(rec)
print(peak_kib())
"""
_WHOLE = _PEAK + """
import sys
from gradwatch.steplog import read_log
read_log(sys.argv[1])
print(peak_kib())
"""
_RATE = """
import sys, time
from gradwatch.steplog import LogReader
t = time.perf_counter()
with LogReader(sys.argv[1]) as r:
    n = sum(1 for _ in r)
print(n / (time.perf_counter() - t))
"""


def _run(script: str, path: Path) -> float:
    out = subprocess.run([sys.executable, "-c", script, str(path)], check=True,
                         capture_output=True, text=True, env={**os.environ,
                                                              "PYTHONWARNINGS": "ignore"})
    return float(out.stdout.split()[-1])


def log_figures(d: Path, steps: int, small: int) -> list[Figure]:
    """The step log's figures (see the module docstring)."""
    logs = {}
    for n in (small, steps):
        logs[n] = d / f"run{n}.jsonl"
        train(logs[n], n)
    packed = {n: d / f"run{n}.jsonl.gz" for n in (small, steps)}
    for n, path in packed.items():
        train(path, n)
    plain = logs[steps].stat().st_size / steps
    figures = [
        Figure("step log, bytes/step (plain)", f"{plain:,.0f}", f"<= {LOG_BYTES_TARGET}",
               plain <= LOG_BYTES_TARGET),
        Figure("step log, bytes/step (.gz)", f"{packed[steps].stat().st_size / steps:,.0f}"),
        Figure("same records as v1 wrote them", f"{v1_bytes(logs[steps]) / steps:,.0f}"),
    ]
    for what, script, target in (("check", _CHECK, True), ("replay's reading", _REPLAY, True),
                                 ("check on .gz", _CHECK, True),
                                 ("read_log (holds the log)", _WHOLE, False)):
        gz = what.endswith(".gz")
        peak = {n: _run(script, (packed if gz else logs)[n]) / 1024 for n in (small, steps)}
        grow = peak[steps] - peak[small]
        figures.append(Figure(
            f"{what}: peak MB {small:,} -> {steps:,} steps",
            f"{peak[small]:.1f} -> {peak[steps]:.1f} ({grow:+.1f})",
            f"< +{GROWTH_TARGET_MB:.0f}" if target else "reference",
            grow < GROWTH_TARGET_MB if target else None))
    rate = _run(_RATE, logs[steps])
    figures.append(Figure(f"LogReader, records/s ({steps:,}-step log)", f"{rate:,.0f}"))
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10_000, help="steps of the long log")
    ap.add_argument("--small", type=int, default=1_000, help="steps of the short log")
    args = ap.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gradwatch-bench-storage-") as tmp:
        d = Path(tmp)
        figures = log_figures(d, args.steps, args.small)
    print(f"model: 10 x Linear(16, 16) (20 tensors), SGD, clean steps, norms every step; "
          f"{time.perf_counter() - started:.0f} s")
    width = max(len(f.name) for f in figures) + 2
    for f in figures:
        verdict = "" if f.ok is None else ("ok" if f.ok else "MISS")
        print(f"{f.name:<{width}}{f.value:>28}   {f.target:<10} {verdict}")


if __name__ == "__main__":
    main()
