"""Storage on PostgreSQL beside SQLite: bytes per stored step and import speed.

The 20-tensor model's step log (``bench/storage_server.probe_log``: 10 x Linear(16,16)
trained with the probe, norms every step) is imported through the streaming import path
(``Runs.import_stream``) into a fresh SQLite data directory and into a fresh database on a
throwaway PostgreSQL cluster (``tests/pgcluster.py``: Debian's ``postgresql`` package,
started by this bench in a temporary directory). Prints per backend:

- bytes per step: the data directory's files (SQLite), or the gradwatch tables with their
  indexes and TOAST (``pg_total_relation_size``, after ``VACUUM``, less the same tables
  empty) for PostgreSQL; target: PostgreSQL at most SQLite's;
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from storage_server import _dir_bytes, _import, probe_log  # noqa: E402

from tests.pgcluster import Cluster  # noqa: E402

TABLES = ("runs", "streams", "records", "series", "steps", "param_norms", "reset_sets",
          "scalars", "step_agg", "optimizers", "findings")


def pg_bytes(url: str) -> int:
    """Bytes of the gradwatch tables (heap, indexes, TOAST) after VACUUM."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as c:
        c.execute("VACUUM")
        got = c.execute("SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c WHERE "
                        "c.relname = ANY(%s) AND c.relkind = 'r'", (list(TABLES),)).fetchone()
        return int(got[0]) if got and got[0] is not None else 0


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
            data = Path(tmp) / "data"
            _, n, dt = asyncio.run(_import(data, log))
            records = sum(1 for _ in log.open("rb"))
            out["sqlite"] = {"bytes_per_step": _dir_bytes(data) / n,
                             "records_per_s": records / dt}
            url = cluster.new_database()
            from gradwatch.server.storage import Store
            Store(url).close()  # the schema, empty: its size is subtracted
            empty = pg_bytes(url)
            _, n, dt = asyncio.run(_import(Path(tmp) / "unused", log, url))
            out["postgresql"] = {"bytes_per_step": (pg_bytes(url) - empty) / n,
                                 "records_per_s": records / dt}
    finally:
        cluster.stop()
    s, g = out["sqlite"], out["postgresql"]
    print(f"{a.steps:,} steps of the {20}-tensor model, imported:")
    print(f"  SQLite:     {s['bytes_per_step']:,.0f} bytes/step, "
          f"{s['records_per_s']:,.0f} records/s")
    print(f"  PostgreSQL: {g['bytes_per_step']:,.0f} bytes/step (target <= SQLite's), "
          f"{g['records_per_s']:,.0f} records/s")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
