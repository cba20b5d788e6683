"""Start-up cost of ``gradwatch run``: a script that only imports torch, plain and under run.

Runs ``python x.py`` and ``python -m gradwatch run --log ... -- x.py`` alternately (pairs,
so a slow spell of a shared machine hits both alike), ``--runs`` pairs after one untimed
warm-up pair, and prints the median wall-clock and CPU time (user + system) of each, their
paired difference (median over pairs, with the interquartile range of the differences) and
the target: ``run`` adds at most 0.3 s. Then the modules each imports (``-X importtime``,
once): how many ``run`` adds, a count that does not depend on the machine's load. The
script does no training: what ``run`` adds is what the probe costs a process before (and
without) an optimizer, plus its exit.

Run: ``python bench/startup.py [--runs N] [--python EXE]``
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = 0.3
"""Seconds ``gradwatch run`` may add to the start of a script."""


def _time(cmd: list[str], cwd: Path) -> tuple[float, float]:
    """Wall-clock and CPU seconds (user + system, the child's) of one run of ``cmd``."""
    c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)


def imports(cmd: list[str], cwd: Path) -> dict[str, int]:
    """The modules ``cmd`` imports, with their own import time in microseconds
    (``python -X importtime``: which modules is deterministic, their times are not)."""
    r = subprocess.run([cmd[0], "-X", "importtime", *cmd[1:]], cwd=cwd, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    out = {}
    for line in r.stderr.splitlines():
        if line.startswith("import time:") and "self [us]" not in line:
            own, _, name = line[len("import time:"):].split("|")
            out[name.strip()] = int(own)
    return out


def _spread(xs: list[float]) -> tuple[float, float, float]:
    """Median and interquartile range."""
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return statistics.median(xs), q[0], q[2]


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
        mods_plain, mods_run = imports(plain, cwd), imports(run, cwd)
    print(f"script: import torch   pairs: {args.runs}   (seconds; median, IQR of the pairs)")
    for k, clock in enumerate(("wall clock", "CPU (user+sys)")):
        p = statistics.median(a[k] for a, _ in pairs)
        r = statistics.median(b[k] for _, b in pairs)
        added, q1, q3 = _spread([b[k] - a[k] for a, b in pairs])
        print(f"{clock}: plain python {p:.2f}, gradwatch run {r:.2f}, added by run (paired) "
              f"{added:.2f}   IQR {q1:.2f} .. {q3:.2f}   target <= {TARGET:.2f}   "
              f"{'ok' if added <= TARGET else 'OVER'}")
    extra = {m: us for m, us in mods_run.items() if m not in mods_plain}
    top = sorted(extra.items(), key=lambda kv: -kv[1])[:8]
    print(f"modules imported: plain {len(mods_plain)}, run {len(mods_run)} "
          f"({len(extra)} more, their own import time {sum(extra.values()) / 1e3:.0f} ms in "
          f"this one run); the largest: "
          + ", ".join(f"{m} {us / 1e3:.0f} ms" for m, us in top))


if __name__ == "__main__":
    main()
