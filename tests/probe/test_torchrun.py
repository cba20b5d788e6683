"""torchrun with two gloo ranks on CPU, launched as the README says, then ``gradwatch check``
on both ranks' logs; and the run id of a torchrun job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gradwatch.probe import runinfo
from gradwatch.steplog import read_log
from tests.probe.test_probe_cli import DDP_SCRIPT, _free_port

BIN = Path(sys.executable).parent


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GRADWATCH_", "TORCHELASTIC_"))}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"  # as an activated venv has it
    return env


@pytest.mark.parametrize("form", ["-m", "--no-python"])
def test_torchrun_launch_as_documented(tmp_path: Path, form: str) -> None:
    (tmp_path / "train.py").write_text(DDP_SCRIPT)
    gradwatch = ["-m", "gradwatch"] if form == "-m" else ["--no-python", "gradwatch"]
    cmd = ["torchrun", "--nproc_per_node", "2", "--master-port", str(_free_port()),
           *gradwatch, "run", "--step-log", "run.jsonl", "--", "train.py"]
    r = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    logs = [tmp_path / "run.rank0.jsonl", tmp_path / "run.rank1.jsonl"]
    heads = [read_log(p).header for p in logs]
    assert [(h.rank, h.world_size) for h in heads] == [(0, 2), (1, 2)]
    # no --rdzv-id: torchrun says "none"; the ranks still share an id of their own
    assert heads[0].run == heads[1].run and heads[0].run.startswith("torchrun-")
    c = subprocess.run(["gradwatch", "check", "--json", *map(str, logs)], cwd=tmp_path,
                       env=_env(), capture_output=True, text=True, timeout=60)
    assert c.returncode == 1, c.stderr
    out = json.loads(c.stdout)
    assert [(f["kind"], f["rank"], f["first_step"]) for f in out["findings"]] == [
        ("missed_reset", 1, 2)]
    assert [(s["rank"], s["steps"]) for s in out["summary"]["streams"]] == [(0, 6), (1, 6)]


def test_torchrun_run_ids(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for k in ("GRADWATCH_RUN_ID", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE"):
        monkeypatch.delenv(k, raising=False)
    assert runinfo.torchrun_id() is None
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-42")
    assert runinfo.run_id() == "job-42"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    ids = set()
    for job in ("none_abc123", "none_def456"):  # two jobs: two folders of their agents
        for rank in (0, 1):
            err = tmp_path / "torchelastic_x" / job / "attempt_0" / str(rank) / "error.json"
            monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(err))
            ids.add((job, runinfo.run_id()))
    assert len({i for _, i in ids}) == 2 and len(ids) == 2
    monkeypatch.setenv("GRADWATCH_RUN_ID", "mine")
    assert runinfo.run_id() == "mine"
