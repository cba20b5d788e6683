"""Storage on PostgreSQL beside SQLite: bytes per stored step and import speed.

The 20-tensor model's step log (``bench/storage_server.probe_log``: 10 x Linear(16,16)
trained with the probe, norms every step) is imported through the streaming import path
(``Runs.import_stream``) into a fresh SQLite data directory and into a fresh database on a
throwaway PostgreSQL cluster (``tests/pgcluster.py``: Debian's ``postgresql`` package,
started by this bench in a temporary directory). Prints per backend:

- bytes per step: the data directory's files (SQLite), or the database's tables with
  their indexes and TOAST (``pg_total_relation_size``, after ``VACUUM``, less the same tables
  empty) for PostgreSQL, once the log is imported as a first run, and what importing it
  again as a second run adds (no longer the first page of every table and index); target:
  PostgreSQL at most SQLite's;
- import step records per second.

Usage: ``python bench/storage_pg.py [--steps N]`` (as root or as a user that may run
``initdb``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from storage_server import _dir_bytes, _import, probe_log  # noqa: E402

from tests.pgcluster import Cluster  # noqa: E402


def pg_bytes(url: str) -> int:
    """Bytes of the database's tables (heap, indexes, TOAST) after VACUUM."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as c:
        c.execute("VACUUM")
        got = c.execute("SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c JOIN "
                        "pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = "
                        "current_schema() AND c.relkind = 'r'").fetchone()
        return int(got[0]) if got and got[0] is not None else 0


def _twice(run: Callable[[], Any], size: Callable[[], int], empty: int,
           records: int) -> dict[str, float]:
    """Import the log as a first run, then again as a second: bytes per step each added
    (the first also fills the pages every table starts with), records/s of the first."""
    _, n, dt = asyncio.run(run())
    first = size()
    _, n2, _ = asyncio.run(run())
    return {"bytes_per_step": (first - empty) / n, "more_bytes_per_step": (size() - first) / n2,
            "records_per_s": records / dt}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its figures."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10_000)
    a = p.parse_args(argv)
    cluster = Cluster()
    out: dict[str, Any] = {"bench": "storage_pg", "steps": a.steps}
    try:
        with tempfile.TemporaryDirectory(prefix="gradwatch-bench-") as tmp:
            log = probe_log(Path(tmp) / "run.jsonl", a.steps)
            records = sum(1 for _ in log.open("rb"))
            data = Path(tmp) / "data"
            out["sqlite"] = _twice(lambda: _import(data, log), lambda: _dir_bytes(data),
                                   0, records)
            url = cluster.new_database()
            from gradwatch.server.storage import Store
            Store(url).close()  # the schema, empty: its size is subtracted
            out["postgresql"] = _twice(lambda: _import(Path(tmp) / "unused", log, url),
                                       lambda: pg_bytes(url), pg_bytes(url), records)
    finally:
        cluster.stop()
    s, g = out["sqlite"], out["postgresql"]
    print(f"{a.steps:,} steps of the {20}-tensor model, imported as a first run / as a "
          f"second run beside it (target: PostgreSQL at most SQLite's):")
    for name, f in (("SQLite:    ", s), ("PostgreSQL:", g)):
        print(f"  {name} {f['bytes_per_step']:,.0f} / {f['more_bytes_per_step']:,.0f} "
              f"bytes/step, {f['records_per_s']:,.0f} records/s")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
