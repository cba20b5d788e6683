"""The PostgreSQL storage benchmark still runs end to end (its figures are not judged
here): both imports of both backends measured, on a throwaway cluster it starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "storage_pg.py"


def test_storage_pg_bench_prints_both_runs_of_both_backends(pg_installed: None) -> None:
    out = subprocess.run([sys.executable, str(BENCH), "--steps", "300"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    got = json.loads(out.splitlines()[-1])
    assert got["steps"] == 300
    for backend in ("sqlite", "postgresql"):
        f = got[backend]
        assert f["bytes_per_step"] > 0 and f["more_bytes_per_step"] > 0, backend
        assert f["records_per_s"] > 0, backend
    assert "PostgreSQL:" in out and "SQLite:" in out
