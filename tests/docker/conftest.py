"""The Docker tests' session fixtures: one engine, one base image and one build of the
gradwatch image for every test of the folder (they are one xdist group: one worker)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docker.dockerkit import DOCKERFILE, REPO, Docker, engine_script

IMAGE = "gradwatch:local"
"""The name compose.yaml and compose.team.yaml give the image they build."""


@pytest.fixture(scope="session")
def docker() -> Iterator[Docker]:
    # Installing docker.io on a fresh machine takes a minute or two.
    # A lease: another test session on this machine may share the engine; the last one
    # out stops it.
    holder = str(os.getpid())
    info = engine_script("start", holder, timeout=400)
    try:
        yield Docker(info["DOCKER"], info["DOCKER_HOST"])
    finally:
        if info.get("GRADWATCH_DOCKER_LEASED") == "1":
            engine_script("stop", holder, timeout=60)


@pytest.fixture(scope="session")
def base_image(docker: Docker) -> str:
    """GRADWATCH_DOCKER_BASE (e.g. python:3.11-slim) where a registry is reachable;
    otherwise the debootstrap image, cached."""
    return (os.environ.get("GRADWATCH_DOCKER_BASE")
            or docker.script("docker-base.sh", timeout=600).splitlines()[-1])


@pytest.fixture(scope="session")
def gradwatch_image(docker: Docker, base_image: str) -> Iterator[str]:
    """``gradwatch:local`` built once on ``base_image``; removed at the end.

    pip in the build trusts what pip here trusts (a TLS-inspecting proxy's CA), which only
    a build secret carries and compose v1 cannot pass: built here with it, a compose
    ``up --build`` of the README's lines then hits this build's cache.
    """
    ca = Path(os.environ.get("PIP_CERT", "/etc/ssl/certs/ca-certificates.crt"))
    secret = ["--secret", f"id=pip-ca,src={ca}"] if ca.is_file() else []
    try:
        docker("build", "-f", str(DOCKERFILE), "-t", IMAGE, "--build-arg", f"BASE={base_image}",
               *secret, str(REPO), timeout=900)
        yield IMAGE
    finally:
        docker("image", "rm", "-f", IMAGE, check=False, timeout=60)
