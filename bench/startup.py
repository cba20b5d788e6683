"""Start-up cost of ``gradwatch run``: a script that only imports torch, plain and under run.

Runs ``python x.py`` and ``python -m gradwatch run --log ... -- x.py`` alternately (pairs,
so a slow spell of a shared machine hits both alike), ``--runs`` pairs after one untimed
warm-up pair, and prints the median wall-clock time of each, their paired difference
(median over pairs, with the interquartile range of the differences) and the target:
``run`` adds at most 0.3 s. The script does no training: what ``run`` adds is what the
probe costs a process before (and without) an optimizer, plus its exit.

Run: ``python bench/startup.py [--runs N] [--python EXE]``
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = 0.3
"""Seconds ``gradwatch run`` may add to the start of a script."""


def _time(cmd: list[str], cwd: Path) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15, help="timed pairs (default 15)")
    ap.add_argument("--python", default=sys.executable, help="interpreter to time")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        cwd = Path(d)
        (cwd / "x.py").write_text("import torch\n")
        plain = [args.python, "x.py"]
        run = [args.python, "-m", "gradwatch", "run", "--log", "x.jsonl", "--", "x.py"]
        _time(plain, cwd)
        _time(run, cwd)
        pairs = []
        for i in range(args.runs):
            order = (plain, run) if i % 2 == 0 else (run, plain)
            t = {id(c): _time(c, cwd) for c in order}
            pairs.append((t[id(plain)], t[id(run)]))
    p = statistics.median(a for a, _ in pairs)
    r = statistics.median(b for _, b in pairs)
    diffs = sorted(b - a for a, b in pairs)
    q = statistics.quantiles(diffs, n=4) if len(diffs) > 1 else [diffs[0]] * 3
    added = statistics.median(diffs)
    print(f"script: import torch   pairs: {args.runs}   (wall clock, seconds)")
    print(f"{'plain python':<28}{p:7.2f}")
    print(f"{'gradwatch run':<28}{r:7.2f}")
    print(f"{'added by run (paired)':<28}{added:7.2f}   IQR {q[0]:.2f} .. {q[2]:.2f}   "
          f"target <= {TARGET:.2f}   {'ok' if added <= TARGET else 'OVER'}")


if __name__ == "__main__":
    main()
