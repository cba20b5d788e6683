"""Storage benchmark, server side: what a stored step costs on disk, import speed and
memory, and a million-step run of a GPT-2-sized model.

Prints figures beside their targets (not pass/fail):

- a 20-tensor model (10 x Linear(16,16)) trained 10,000 clean steps with the probe, norms
  every step (its step log written by the probe itself; synthetic records of the same
  shape when torch is missing): the server data directory's bytes per step after import
  (target <= 250), import step records/s through the streaming import path
  (``Runs.import_stream``, what ``POST /api/runs/import`` runs; target >= 50,000/s), and
  the import's peak memory growth from the 1,000- to the 10,000-step log (a fresh process
  each, ``ru_maxrss``; target < 25 MB);
- a synthetic 1,000,000-step run of a 150-tensor model stored through the storage writer:
  the database's size (target <= 1.5 GB) and the time of the dashboard's first chart
  request (``GET /api/runs/{id}/steps``, the reader and the frame's JSON).

Usage: ``python bench/storage_server.py [--steps N] [--no-million] [--keep DIR]``.
Other benches may import :func:`probe_log` and :func:`import_figures`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gradwatch.encoding import as_float32  # noqa: E402
from gradwatch.frames import StepSeries, frame_json  # noqa: E402
from gradwatch.wire import Header, OptimizerInfo, Reset, Step, trusted  # noqa: E402

TENSORS = 20


def probe_log(path: Path, steps: int) -> Path:
    """A step log of the 20-tensor model trained ``steps`` clean steps, norms every step."""
    path.unlink(missing_ok=True)
    try:
        import torch

        import gradwatch
    except ImportError:
        return _synthetic_log(path, steps)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(10)])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(8, 16), torch.randn(8, 16)
    with gradwatch.watch(opt, model=model, log=path, run_name="bench-storage"):
        for _ in range(steps):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    return path


def _synthetic_log(path: Path, steps: int) -> Path:
    recs: list[Any] = [
        Header(seq=0, t=1e9, run="bench-storage", run_name="bench-storage",
               torch_version="", gradwatch_version="", started=1e9),
        OptimizerInfo(seq=1, t=1e9, opt="SGD#0", cls="SGD",
                      params=[f"{i // 2}.{'weight' if i % 2 == 0 else 'bias'}"
                              for i in range(TENSORS)])]
    with path.open("w") as fh:
        for r in recs:
            fh.write(r.model_dump_json() + "\n")
        for i in range(steps):
            pn = [as_float32(0.1 + 0.01 * math.sin(i + k)) for k in range(TENSORS)]
            n = as_float32(math.sqrt(sum(v * v for v in pn)))
            fh.write(Step(seq=i + 2, t=1e9 + i * 1e-3, opt="SGD#0", step=i, backwards=1,
                          consumed=TENSORS, fresh=TENSORS,
                          resets=[Reset(how="optimizer_zero_grad",
                                        params=list(range(TENSORS)))],
                          norm=n, fresh_norm=n, drift=1.0, param_norms=pn,
                          param_fresh_norms=pn).model_dump_json() + "\n")
    return path


def _dir_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.iterdir() if p.is_file())


async def _import(data: Path, log: Path, db: str | None = None) -> tuple[str, int, float]:
    """Import ``log`` as ``gradwatch serve`` would, into ``data`` (or the database ``db``):
    the run id, the steps stored and the import's seconds."""
    from gradwatch.gcpause import settle_server_heap
    from gradwatch.server.importing import BLOCK_BYTES
    from gradwatch.server.runs import Runs
    from gradwatch.server.settings import Settings, default_parse_processes

    # As ``gradwatch serve`` runs it: the heap settled once start-up's imports are done,
    # its parser processes beside the event loop and the writer.
    settle_server_heap()
    runs = Runs(Settings(data_dir=data, db=db, parse_processes=default_parse_processes()))
    runs.start()

    async def chunks() -> Any:
        with log.open("rb") as fh:
            while b := fh.read(BLOCK_BYTES):
                yield b

    try:
        await runs.parser.started()  # a server's parser processes are up before imports
        t = time.perf_counter()
        run_id, n, _ = await runs.import_stream(chunks(), log.name)
        dt = time.perf_counter() - t
    finally:
        runs.close()
    return run_id, n, dt


def import_figures(log: Path, data: Path) -> dict[str, float]:
    """Import ``log`` into the empty data directory ``data``: records/s and bytes/step."""
    records = sum(1 for _ in log.open("rb"))
    _, steps, dt = asyncio.run(_import(data, log))
    return {"steps": steps, "records_per_s": records / dt, "seconds": dt,
            "bytes_per_step": _dir_bytes(data) / steps, "log_bytes_per_step":
            log.stat().st_size / steps}


def _child_rss(log: Path) -> int:
    """Peak RSS growth (bytes) of a fresh process importing ``log``."""
    out = subprocess.run([sys.executable, __file__, "--child-import", str(log)],
                         capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


def _hwm() -> int:
    """This process's peak resident set (bytes) since the last reset."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _child(log: Path) -> None:
    import gc

    from gradwatch.server import runs  # noqa: F401  (imports before the baseline)
    gc.collect()
    with tempfile.TemporaryDirectory() as d:
        base = int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize()
        with contextlib.suppress(OSError):  # reset the peak to the present (Linux)
            Path("/proc/self/clear_refs").write_text("5")
        asyncio.run(_import(Path(d) / "data", log))
        print(_hwm() - base)


def million(data: Path, steps: int = 1_000_000, tensors: int = 150) -> dict[str, float]:
    """Store a synthetic run through the storage writer; its size and first chart time."""
    from gradwatch.server.batch import batch_of_records
    from gradwatch.server.reader import Reader
    from gradwatch.server.storage import Store

    store = Store(data)
    header = Header(seq=0, t=1e9, run="million", run_name="million", torch_version="",
                    gradwatch_version="", started=1e9)
    opt = OptimizerInfo(seq=1, t=1e9, opt="AdamW#0", cls="AdamW",
                        params=[f"h.{i}" for i in range(tensors)])
    store.ingest(batch_of_records("million", 0, [header, opt]))
    resets = [Reset(how="optimizer_zero_grad", params=list(range(tensors)))]
    fields = {f: Step.model_fields[f].get_default(call_default_factory=True)
              for f in Step.model_fields}
    vals = [as_float32(0.01 + 1e-3 * v) for v in range(97)]  # float32 values, as the probe's
    t = time.perf_counter()
    for lo in range(0, steps, 5000):
        recs = []
        for i in range(lo, min(steps, lo + 5000)):
            pn = [vals[(i * 7 + k) % 97] for k in range(tensors)]
            n = as_float32(1.0 + 0.3 * math.sin(i / 50))
            recs.append(trusted(Step, {**fields, "seq": i + 2, "t": 1e9 + i * 0.5,
                                       "opt": "AdamW#0", "step": i, "backwards": 1,
                                       "consumed": tensors, "fresh": tensors,
                                       "resets": resets, "norm": n, "fresh_norm": n,
                                       "drift": 1.0, "param_norms": pn,
                                       "param_fresh_norms": pn}))
        store.ingest(batch_of_records("million", 0, recs))
    build = time.perf_counter() - t
    store.close()
    size = _dir_bytes(data)
    reader = Reader(data)
    t = time.perf_counter()
    series = reader.steps("million", max_points=4000)
    assert series is not None and series.total == steps
    frame_json(StepSeries, **series.columns())
    first = time.perf_counter() - t
    reader.close()
    return {"bytes": size, "first_chart_s": first, "build_s": build}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its figures."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10_000)
    p.add_argument("--no-million", action="store_true")
    p.add_argument("--imports", type=int, default=5, help="imports of the log, each into "
                   "a fresh data directory; the median rate is reported")
    p.add_argument("--keep", type=Path, default=None, help="leave the files in DIR")
    p.add_argument("--child-import", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child_import:
        _child(a.child_import)
        return 0
    with tempfile.TemporaryDirectory(prefix="gradwatch-bench-") as tmp:
        d = a.keep or Path(tmp)
        d.mkdir(parents=True, exist_ok=True)
        small = probe_log(d / "small.jsonl", 1_000)
        big = probe_log(d / f"run{a.steps}.jsonl", a.steps)
        runs = [import_figures(big, d / f"data{i}") for i in range(max(1, a.imports))]
        f = runs[0]
        rates = sorted(r["records_per_s"] for r in runs)
        f["records_per_s"] = statistics.median(rates)
        print(f"{a.steps:,}-step log of {TENSORS} tensors: {f['log_bytes_per_step']:,.0f} "
              f"bytes/step in the step log", flush=True)
        print(f"server data directory after import: {f['bytes_per_step']:,.0f} bytes/step "
              f"(target <= 250)", flush=True)
        print(f"import: {f['records_per_s']:,.0f} records/s, the median of {len(rates)} "
              f"imports into fresh data directories (range {rates[0]:,.0f} to "
              f"{rates[-1]:,.0f}; target >= 50,000/s)", flush=True)
        r1, r10 = _child_rss(small), _child_rss(big)
        print(f"import peak memory: {r1 / 2**20:.1f} MB for 1,000 steps, "
              f"{r10 / 2**20:.1f} MB for {a.steps:,}: growth {(r10 - r1) / 2**20:.1f} MB "
              f"(target < 25 MB)", flush=True)
        if not a.no_million:
            m = million(d / "million")
            print(f"1,000,000 steps x 150 tensors: database {m['bytes'] / 1e9:.2f} GB "
                  f"(target <= 1.5 GB), first chart (GET steps?max_points=4000) "
                  f"{m['first_chart_s'] * 1e3:.0f} ms (built in {m['build_s']:.0f} s, "
                  f"{1e6 / m['build_s']:,.0f} records/s through the writer)", flush=True)
    print(json.dumps({"bench": "storage_server"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
