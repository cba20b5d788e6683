"""The two torchrun launches of ``tests/probe/sharded_loops.py`` the sharded tests share (the
``sharded_launches`` fixture of ``tests/conftest.py``): two gloo ranks on CPU under
``gradwatch run``, streaming into a real server as they write their step logs, and the same
launch without the probe, the differential test's other side. A launch takes about half a
minute, so one worker makes them once (the tests using them are one xdist_group)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.probe import sharded_loops
from tests.probe.test_probe_cli import _free_port
from tests.probe.test_torchrun import _env
from tests.serverproc import ServerProc

RUN = "fsdp-tp-live"
"""The run id the probe's launch streams under (``GRADWATCH_RUN_ID``)."""


@dataclass(frozen=True)
class Launches:
    """What the launches left: their folders, and what the server answered about the run."""

    probe: Path
    """The probe's launch: step logs ``run.rank*.jsonl``, the script's ``rank*.pt``."""
    plain: Path
    """The same launch without the probe: its ``rank*.pt``."""
    run: dict[str, Any]
    """``GET /api/runs/{RUN}`` once the launch ended."""
    model: dict[str, Any]
    """``GET /api/runs/{RUN}/steps``: the model's norms (the default)."""
    own: dict[str, Any]
    """``GET /api/runs/{RUN}/steps?norms=rank``: each rank's shard norms."""


def _launch(out: Path, gradwatch: list[str], env: dict[str, str]) -> None:
    out.mkdir()
    cmd = ["torchrun", "--nproc_per_node", "2", "--master-port", str(_free_port()),
           *gradwatch, str(Path(sharded_loops.__file__)), str(out)]
    r = subprocess.run(cmd, cwd=out, env={**_env(), **env}, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    assert "SIGSEGV" not in r.stderr and "turned itself off" not in r.stderr


def launch_both(base: Path) -> Launches:
    """Run both launches in folders under ``base`` (the probe's streams to a server there)."""
    with ServerProc(base / "data") as srv:
        _launch(base / "probe", ["-m", "gradwatch", "run", "--server", srv.ws, "--step-log",
                                 "run.jsonl", "--"], {"GRADWATCH_RUN_ID": RUN})
        run = srv.get(f"/api/runs/{RUN}")
        model = srv.get(f"/api/runs/{RUN}/steps")
        own = srv.get(f"/api/runs/{RUN}/steps?norms=rank")
    _launch(base / "plain", [], {})
    return Launches(base / "probe", base / "plain", run, model, own)
