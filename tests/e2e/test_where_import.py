"""A probe's step log with ``site`` records imports into the server, and the findings it
serves name their lines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

import gradwatch
from tests.serverproc import ServerProc


def test_imported_findings_keep_their_lines(tmp_path: Path) -> None:
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    log = tmp_path / "late.jsonl"
    with gradwatch.watch(opt, log=log, run_id="late1"):
        for _ in range(3):
            m(torch.randn(8, 4)).pow(2).mean().backward()
            reset_line = sys._getframe().f_lineno + 1
            opt.zero_grad()
            opt.step()
    r = subprocess.run([sys.executable, "-m", "gradwatch.cli", "serve", "--data",
                        str(tmp_path / "d"), "--import", str(log), "--import-only"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    with ServerProc(tmp_path / "d") as srv:
        (f,) = srv.get("/api/runs/late1/findings")["findings"]
    assert f["kind"] == "late_reset"
    assert [w["role"] for w in f["where"]] == ["reset", "backward", "step"]
    assert f["where"][0]["line"] == reset_line and f["where"][0]["file"] == __file__
