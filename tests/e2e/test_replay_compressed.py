"""``gradwatch replay`` of a compressed step log: as a new run, and ``--resume`` into its own."""

from __future__ import annotations

import gzip
import re
import subprocess
import sys
from pathlib import Path

import synth

from tests.serverproc import ServerProc


def gw(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gradwatch", *args], capture_output=True,
                          text=True, timeout=120)


def test_a_compressed_log_replays_as_a_new_run_and_resumes_into_its_own(
        tmp_path: Path) -> None:
    recs = synth.records("packed", steps=300, stale_from=250)
    log = tmp_path / "run.jsonl.gz"
    log.write_bytes(gzip.compress(synth.log_text(recs).encode()))
    with ServerProc(tmp_path / "data") as srv:
        r = gw("replay", str(log), "--server", srv.ws, "--fast")
        assert r.returncode == 0, r.stderr
        replayed = re.search(r"as run (\S+)", r.stdout)
        assert replayed and srv.get(f"/api/runs/{replayed[1]}")["steps"] == 300
        first = tmp_path / "first.jsonl"
        first.write_text(synth.log_text(recs[:120]))
        assert gw("replay", str(first), "--server", srv.ws, "--resume").returncode == 0
        r = gw("replay", str(log), "--server", srv.ws, "--resume")
        assert r.returncode == 0, r.stderr
        assert f"the server had 120 records, sent {len(recs) - 120}" in r.stdout
        got = srv.get("/api/runs/packed")
        assert got["steps"] == 300 and got["status"] == "finished"
