"""The storage benchmark still runs end to end (its figures are not judged here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "storage.py"


def test_storage_bench_prints_the_log_and_reader_figures() -> None:
    out = subprocess.run([sys.executable, str(BENCH), "--steps", "60", "--small", "20"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    for line in ("step log, bytes/step (plain)", "step log, bytes/step (.gz)",
                 "same records as v1 wrote them", "check: peak MB 20 -> 60 steps",
                 "replay's reading: peak MB", "check on .gz: peak MB", "LogReader, records/s"):
        assert line in out, line
