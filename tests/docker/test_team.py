"""The team server in Docker (docker/compose.team.yaml): PostgreSQL 15 and two gradwatch
servers, brought up, used and brought down with the README's own lines.

A training run streams into server A (``--server ws://A,ws://B``) and is read through
server B while it runs; A is killed mid-run, the probe moves to B and the run ends there
whole: each step once, the verdict of the local step log. Brought down and up again, both
servers still have it (the database's named volume). The database password is in no
container's process arguments and no log. Where no registry is reachable (here), the
PostgreSQL image is Debian's package on the debootstrap base (scripts/docker-postgres.sh);
the gradwatch image is the folder's one build (conftest.py).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.docker.dockerkit import (
    ARTIFACTS,
    REPO,
    SKIP,
    Docker,
    ReadmeShell,
    get,
    readme_block,
    wait_for_steps,
    wait_healthy,
)
from tests.serverproc import free_port

TEAM = REPO / "docker" / "compose.team.yaml"
HEADING = "A team server on PostgreSQL"
CONTAINERS = ("gradwatch-postgres", "gradwatch-a", "gradwatch-b")
pytestmark = pytest.mark.xdist_group("docker")
skip_docker = pytest.mark.skipif(SKIP, reason="GRADWATCH_SKIP_DOCKER=1")

log = logging.getLogger(__name__)

STEPS = 40  # optimizer steps of the streamed run
PAUSE_AT = 20  # the run waits after this step until server A is killed


def test_team_compose_shares_one_database_with_two_loopback_servers() -> None:
    compose = yaml.safe_load(TEAM.read_text())
    services = compose["services"]
    assert set(services) == {"postgres", "gradwatch-a", "gradwatch-b"}
    pg = services["postgres"]
    assert pg["image"] == "${GRADWATCH_POSTGRES_IMAGE:-postgres:15}"
    assert "ports" not in pg, "PostgreSQL is published"
    volume, _, target = pg["volumes"][0].partition(":")
    assert volume in compose["volumes"] and target == "/var/lib/postgresql/data"
    assert "pg_isready" in pg["healthcheck"]["test"]
    assert pg["healthcheck"]["interval"] == "${GRADWATCH_HEALTH_INTERVAL:-5s}"
    published = []
    for name in ("gradwatch-a", "gradwatch-b"):
        s = services[name]
        assert s["image"] == "gradwatch:local"
        assert s["depends_on"]["postgres"]["condition"] == "service_healthy"
        env = s["environment"]
        # the password reaches libpq as PGPASSWORD, never in the URL (logs, errors)
        assert env["GRADWATCH_DB"] == "postgresql://gradwatch@postgres:5432/gradwatch"
        assert env["PGPASSWORD"].startswith("${GRADWATCH_DB_PASSWORD:?")
        assert "GRADWATCH_TOKEN" in env
        (port,) = s["ports"]
        assert str(port).startswith("127.0.0.1:") and str(port).endswith(":8765")
        published.append(port)
        assert "/healthz" in " ".join(s["healthcheck"]["test"])
        assert s["healthcheck"]["interval"] == "${GRADWATCH_HEALTH_INTERVAL:-10s}"
    assert len(set(published)) == 2


def test_readme_team_lines_name_files_that_exist() -> None:
    lines, section = readme_block(HEADING)
    assert lines[0].startswith("export GRADWATCH_DB_PASSWORD=")
    assert lines[1].startswith("docker compose -f docker/compose.team.yaml up -d")
    assert "ws://127.0.0.1:8765,ws://127.0.0.1:8766" in lines[2]
    assert lines[-1] == "docker compose -f docker/compose.team.yaml down"
    assert TEAM.is_file() and (REPO / "scripts" / "docker-postgres.sh").is_file()
    assert "scripts/docker-postgres.sh" in section


TRAIN = f"""\
import os, time
import torch
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for i in range({STEPS}):
    model(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()  # zero_grad forgotten
    if i == {PAUSE_AT}:  # the test kills server A here, then lets the run go on
        while not os.path.exists("go"):
            time.sleep(0.05)
"""


@skip_docker
@pytest.mark.docker
@pytest.mark.timeout(900)
def test_readme_team_lines_run_as_written_and_fail_over(
        docker: Docker, base_image: str, gradwatch_image: str, tmp_path: Path) -> None:
    """Each line of the README's team block, in a shell, on this machine's engine (with
    docker.io, ``docker compose`` as the README says to write it); only the host ports
    are changed, to free ones (``GRADWATCH_PORT_A``/``_B``, as the compose file allows), and
    the healthchecks' interval."""
    from gradwatch.steplog import read_log
    from gradwatch.verdict import verdict_of
    from gradwatch.wire import Step

    export, up, stream, down = readme_block(HEADING)[0]
    port_a, port_b = free_port(), free_port()
    a, b = f"http://127.0.0.1:{port_a}", f"http://127.0.0.1:{port_b}"
    # Healthchecks every second (GRADWATCH_HEALTH_INTERVAL): each `up` waits PostgreSQL's
    # first check, then the servers', 1 s each, not the default 5 s and 10 s.
    env = ReadmeShell.env(docker, base_image, tmp_path / "spool",
                          GRADWATCH_PORT_A=str(port_a), GRADWATCH_PORT_B=str(port_b),
                          GRADWATCH_HEALTH_INTERVAL="1s")
    sh = ReadmeShell(docker, env, tmp_path, {8765: port_a, 8766: port_b})
    if not os.environ.get("GRADWATCH_DOCKER_BASE"):  # no registry: Debian's PostgreSQL 15
        env["GRADWATCH_POSTGRES_IMAGE"] = docker.script(
            "docker-postgres.sh", timeout=600, env=env).splitlines()[-1]
    (tmp_path / "train.py").write_text(TRAIN)

    def healthy() -> None:
        wait_healthy(docker, "gradwatch-postgres", None, timeout=120)
        wait_healthy(docker, "gradwatch-a", a)
        wait_healthy(docker, "gradwatch-b", b)

    # `export NAME=value`: the value, as the user's shell makes it, for the lines after it
    name = export.split()[1].split("=", 1)[0]
    made = subprocess.run(["bash", "-c", f'{export}; printf %s "${name}"'], env=env,
                          capture_output=True, text=True, check=True)
    password = env[name] = made.stdout
    assert len(password) >= 16
    training: subprocess.Popen[str] | None = None

    def remove() -> None:  # the compose file's fixed names: this test's to remove
        docker("rm", "-f", *CONTAINERS, check=False, timeout=60)
        docker("volume", "rm", "-f", "gradwatch-pgdata", check=False, timeout=60)
        docker("network", "rm", "gradwatch-team", check=False, timeout=60)

    remove()  # a database left by an earlier run keeps that run's password
    try:
        sh(up)
        healthy()
        for c in CONTAINERS:  # the password: in no process's arguments and no log
            seen = docker("top", c) + docker("logs", c, stderr=True)
            assert password not in seen, f"the database password shows in {c}"
        training = sh.start(stream)
        spool = tmp_path / "spool"
        deadline = time.monotonic() + 120
        while not list(spool.glob("**/*.jsonl")) and time.monotonic() < deadline:
            time.sleep(0.2)
        (step_log,) = spool.glob("**/*.jsonl")
        run = json.loads(step_log.read_text().split("\n", 1)[0])["run"]
        # streamed into A, read through B (the shared database; live frames by NOTIFY)
        seen_b = wait_for_steps(b, run, PAUSE_AT + 1, timeout=120, ended=False)
        assert seen_b["status"] == "live"
        docker("kill", "gradwatch-a")  # server A dies mid-run
        (tmp_path / "go").touch()
        out, _ = training.communicate(timeout=300)
        assert training.returncode == 0, out[-3000:]
        local = read_log(step_log)
        sent = [r.step for r in local.records if isinstance(r, Step)]
        assert sent == list(range(STEPS))
        summary = wait_for_steps(b, run, STEPS, timeout=60)
        assert (summary["steps"], summary["status"]) == (STEPS, "finished")
        assert sorted(get(f"{b}/api/runs/{run}/steps")["step"]) == sent  # each step once
        want = [f.model_dump(mode="json")
                for f in verdict_of([local.header, *local.records]).findings()]
        assert get(f"{b}/api/runs/{run}/findings")["findings"] == want
        assert "missed_reset" in {f["kind"] for f in want}
        sh(down)
        assert docker("ps", "-a", "-q", "--filter", "name=^gradwatch-") == ""
        sh(up)  # "stop; the runs stay": on either server
        healthy()
        for base in (a, b):
            assert get(f"{base}/api/runs/{run}")["steps"] == STEPS
    except BaseException:
        ARTIFACTS.mkdir(exist_ok=True)
        for c in CONTAINERS:
            (ARTIFACTS / f"docker-{c}.log").write_text(
                docker("logs", c, check=False, stderr=True, timeout=30))
        raise
    finally:
        if training is not None and training.poll() is None:
            training.kill()
            training.communicate()
        remove()
