"""The server bench's many-runs part still runs end to end on SQLite and on two servers
sharing a PostgreSQL database (its figures are not judged here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[2] / "bench" / "server_ingest.py"


def test_server_bench_prints_many_runs_on_sqlite_and_on_two_postgresql_servers(
        pg_cluster: Any) -> None:
    out = subprocess.run([sys.executable, str(BENCH), "--only-many", "--steps", "320",
                          "--seconds", "0.25", "--db", pg_cluster.new_database()],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    # each line is printed only after the stored step counts matched what was sent
    for where in ("SQLite, 1 server", "PostgreSQL, 2 servers"):
        line = next(x for x in out.splitlines() if f"at once, {where}:" in x)
        assert "320 records" in line and "50 live clients: p50" in line
        assert "nan" not in line, line  # the live clients received rows
