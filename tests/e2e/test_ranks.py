"""Several processes (ranks) of one training job stream into one run, each tagged."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.serverproc import ServerProc

RANK_SCRIPT = textwrap.dedent("""
    import os, sys, torch, gradwatch
    rank = int(os.environ["RANK"])
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with gradwatch.watch(opt, model=model, server=sys.argv[1], log=sys.argv[2],
                         run_name="two ranks"):
        for i in range(30):
            if rank == 0 or i < 10:  # rank 1 forgets zero_grad from step 10 on
                opt.zero_grad()
            model(torch.randn(16, 6)).pow(2).mean().backward()
            opt.step()
""")


def test_two_ranks_stream_into_one_run(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    with ServerProc(tmp_path / "data") as srv:
        procs = [
            subprocess.Popen(
                [sys.executable, str(script), srv.ws, str(tmp_path / "job.jsonl")],
                env={**os.environ, "RANK": str(r), "WORLD_SIZE": "2",
                     "GRADWATCH_RUN_ID": "job-2ranks"},
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            for r in (0, 1)
        ]
        for p in procs:
            out, _ = p.communicate(timeout=120)
            assert p.returncode == 0, out.decode()
        run = srv.get("/api/runs/job-2ranks")
        assert run["ranks"] == [0, 1] and run["steps"] == 60
        assert run["status"] == "finished"
        for r in (0, 1):
            steps = srv.get(f"/api/runs/job-2ranks/steps?rank={r}&max_points=1000")
            assert steps["step"] == list(range(30)) and set(steps["rank"]) == {r}
        findings = srv.get("/api/runs/job-2ranks/findings")["findings"]
        assert [(f["kind"], f["rank"], f["first_step"], f["steps"]) for f in findings] == [
            ("missed_reset", 1, 10, 20)]
    # each rank also kept its own step log
    assert (tmp_path / "job.rank0.jsonl").is_file() and (tmp_path / "job.rank1.jsonl").is_file()
