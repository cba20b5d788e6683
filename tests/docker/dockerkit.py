"""What the Docker tests share: the client of one engine, the README's command blocks, and
waiting for a container or a run as a user would (over HTTP from this machine)."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker" / "Dockerfile"
ARTIFACTS = REPO / "test-artifacts"
SKIP = os.environ.get("GRADWATCH_SKIP_DOCKER") == "1"

log = logging.getLogger(__name__)


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

    def script(self, name: str, *args: str, timeout: float, env: dict[str, str] | None = None
               ) -> str:
        t0 = time.monotonic()
        result = subprocess.run(
            ["bash", str(REPO / "scripts" / name), *args],
            env=env or self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if result.returncode != 0:
            raise AssertionError(f"{name} exited {result.returncode}:\n{result.stderr[-4000:]}")
        log.info("%s: %.1f s\n%s", name, time.monotonic() - t0, result.stderr.strip())
        return result.stdout.strip()

    def compose_word(self) -> str | None:
        """``None`` where ``docker compose`` (the v2 plugin) works, else the README's form
        for Debian's docker.io (compose v1)."""
        plugin = subprocess.run([self.client, "compose", "version"], env=self.env,
                                capture_output=True, timeout=30)
        return None if plugin.returncode == 0 else readme_docker_lines()[1]


def engine_script(*args: str, timeout: float) -> dict[str, str]:
    """``scripts/docker-engine.sh ARGS``; its ``NAME=value`` lines."""
    t0 = time.monotonic()
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "docker-engine.sh"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if result.returncode != 0:
        raise AssertionError(f"docker-engine.sh {' '.join(args)}:\n{result.stderr[-4000:]}")
    log.info("docker-engine.sh %s: %.1f s\n%s", " ".join(args), time.monotonic() - t0,
             result.stderr.strip())
    return dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)


def get(url: str, timeout: float = 5, token: str | None = None) -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=timeout) as response:
        body = response.read()
        if response.headers.get_content_type() == "application/json":
            return json.loads(body)
        return body.decode("utf-8", "replace")


def wait_healthy(docker: Docker, name: str, base: str | None, timeout: float = 90) -> None:
    """Until the container's own healthcheck says healthy and, given ``base``, /healthz
    answers from the host."""
    deadline = time.monotonic() + timeout
    status = ""
    while time.monotonic() < deadline:
        status = docker("inspect", "-f", "{{.State.Status}} {{.State.Health.Status}}", name)
        if status.startswith("exited") or status.startswith("dead"):
            break
        if status == "running healthy":
            try:
                if base is None or get(f"{base}/healthz")["status"] == "ok":
                    log.info("%s healthy after %.1f s", name, timeout - deadline + time.monotonic())
                    return
            except (OSError, urllib.error.URLError):
                pass
        time.sleep(0.5)
    logs = docker("logs", "--tail", "60", name, check=False, stderr=True)
    raise AssertionError(f"container {name} is not healthy ({status}); its log:\n{logs}")


def wait_for_steps(base: str, run: str, steps: int, timeout: float = 30,
                   ended: bool = True) -> dict[str, Any]:
    """The run's summary once it has ``steps`` steps (and, with ``ended``, is no longer
    live)."""
    deadline = time.monotonic() + timeout
    summary: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            summary = get(f"{base}/api/runs/{run}")
            if summary["steps"] >= steps and not (ended and summary["status"] == "live"):
                return summary
        except urllib.error.HTTPError as e:
            if e.code != 404:
                raise
        time.sleep(0.3)
    raise AssertionError(f"run {run} did not arrive with {steps} steps: {summary}")


def readme_block(heading: str, readme: Path = REPO / "README.md") -> tuple[list[str], str]:
    """The first bash block under the README's ``### heading`` as command lines (a ``\\``
    continuation joined, comments dropped), and the section's text."""
    text = readme.read_text()
    section = text[text.index(f"\n### {heading}\n"):]
    ends = [i for i in (section.find("\n## ", 1), section.find("\n### ", 1)) if i > 0]
    section = section[:min(ends)] if ends else section
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, f"the README's section {heading!r} has no bash block"
    joined = block.group(1).replace("\\\n", " ")
    lines = [" ".join(line.split(" #", 1)[0].split()) for line in joined.splitlines()]
    return [line for line in lines if line], section


def readme_docker_lines(readme: Path = REPO / "README.md") -> tuple[list[str], str]:
    """The README's "In Docker" block as command lines, and what it says to write for
    ``docker compose`` where Debian's docker.io is the engine."""
    lines, section = readme_block("In Docker", readme)
    debian = re.search(r"write\s+`([^`]+)`\s+for\s+`docker compose`", section)
    assert debian, "the README does not say what to write for `docker compose` on docker.io"
    return lines, " ".join(debian.group(1).split())


class ReadmeShell:
    """Runs README lines as a user pastes them, in bash: ``docker compose`` becomes what the
    README says to write where the plugin is missing (Debian's docker.io), and the
    documented loopback ports move to free ones (``ports``: documented → used).

    Args:
        env: the environment the lines run in (:meth:`env` makes the usual one).
        cwd: where lines that are not compose lines run (compose lines run in the checkout).
    """

    def __init__(self, docker: Docker, env: dict[str, str], cwd: Path, ports: dict[int, int]):
        self.word = docker.compose_word()
        if self.word is not None and shutil.which("docker-compose") is None:
            pytest.fail("no `docker compose` plugin and no docker-compose (apt install "
                        "docker-compose, as the README says)")
        self.env, self.cwd, self.ports = env, cwd, ports

    @staticmethod
    def env(docker: Docker, base_image: str, spool: Path, **extra: str) -> dict[str, str]:
        """The engine's environment with /usr/bin first (the client that ships with
        Debian's dockerd, BuildKit built in, as docker-engine.sh picks it), the base image
        the compose files take (``GRADWATCH_BASE``) and a spool for ``gradwatch run``."""
        return {**docker.env, "PATH": f"/usr/bin:{Path(sys.executable).parent}:"
                f"{os.environ['PATH']}", "GRADWATCH_BASE": base_image,
                "GRADWATCH_SPOOL_DIR": str(spool), **extra}

    def start(self, line: str) -> subprocess.Popen[str]:
        """The line, started (its output and errors merged on ``stdout``)."""
        if self.word is not None:
            line = line.replace("docker compose", self.word)
        for documented, used in self.ports.items():
            line = line.replace(f"127.0.0.1:{documented}", f"127.0.0.1:{used}")
        return subprocess.Popen(["bash", "-c", line], env=self.env, text=True,
                                cwd=self.cwd if "compose" not in line else REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def __call__(self, line: str, timeout: float = 900) -> str:
        """Run the line to its end; its output. Fails the test when it exits non-zero."""
        t0 = time.monotonic()
        proc = self.start(line)
        out, _ = proc.communicate(timeout=timeout)
        log.info("%s: %.1f s", line, time.monotonic() - t0)
        assert proc.returncode == 0, f"README line {line!r} exited {proc.returncode}:\n" \
                                     f"{out[-3000:]}"
        return out
