"""The package as users install it: built from this checkout (sdist, then the wheel from the
sdist), installed by pip into fresh virtual environments that have no torch.

``pip install gradwatch`` gives the probe's torch error, ``check`` and the install hints;
``pip install 'gradwatch[server]'`` serves the dashboard and adds at most 50 MiB. pip's
cache (warm after scripts/setup.sh) keeps the installs to seconds.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.core.logs import missed_reset_log, write
from tests.serverproc import free_port

from .vendor import BUNDLE, ROOT

pytestmark = pytest.mark.slow

MiB = 1 << 20
SERVER_EXTRA_BUDGET = 50 * MiB
"""Most a torch-free ``gradwatch[server]`` may add to a fresh virtual environment."""


@dataclass
class Dist:
    wheel: Path
    sdist: Path
    log: str
    """Everything ``python -m build`` printed, the build backend's output included."""


@dataclass
class Venv:
    root: Path

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    def site_packages(self) -> Path:
        return next((self.root / "lib").glob("python3*/site-packages"))

    def run(self, *cmd: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run a command of this venv outside the checkout, so nothing imports from it."""
        exe = str(self.bin / cmd[0])
        return subprocess.run([exe, *cmd[1:]], capture_output=True, text=True, cwd=cwd,
                              env=_clean_env(), timeout=timeout)


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # Byte-compiling is a normal part of a build and an install; the suite's environment
    # may switch it off, which setuptools reports as a warning.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _venv(path: Path, *requirements: str) -> Venv:
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=120)
    venv = Venv(path)
    if requirements:
        r = venv.run("python", "-m", "pip", "install", "--disable-pip-version-check", "-q",
                     *requirements, cwd=path, timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
    return venv


def _disk_bytes(root: Path) -> int:
    """Bytes ``du`` counts under ``root``: allocated blocks, each file once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in [".", *files]:
            st = os.lstat(os.path.join(dirpath, name))
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    out = tmp_path_factory.mktemp("dist")
    r = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
                       capture_output=True, text=True, env=_clean_env(), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return Dist(wheel=next(out.glob("gradwatch-*.whl")), sdist=next(out.glob("gradwatch-*.tar.gz")),
                log=r.stdout + r.stderr)


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    return _venv(tmp_path_factory.mktemp("venv") / "bare")


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, dist: Dist) -> Venv:
    return _venv(tmp_path_factory.mktemp("venv") / "base", str(dist.wheel))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, dist: Dist) -> Venv:
    return _venv(tmp_path_factory.mktemp("venv") / "server", f"{dist.wheel}[server]")


def test_the_build_is_free_of_warnings_and_the_wheel_ships_the_dashboard(dist: Dist) -> None:
    warnings = [line for line in dist.log.splitlines() if re.search(r"warn|deprecat", line, re.I)]
    assert warnings == []
    with zipfile.ZipFile(dist.wheel) as whl:
        names = set(whl.namelist())
        assert whl.read("gradwatch/web/vendor/plotly.min.js") == BUNDLE.read_bytes()
        meta = whl.read("gradwatch-0.1.0.dist-info/METADATA").decode()
    assert {"gradwatch/py.typed", "gradwatch/web/index.html", "gradwatch/web/js/main.js",
            "gradwatch/web/vendor/LICENSE-plotly.js", "gradwatch/server/app.py",
            "gradwatch/probe/api.py", "gradwatch-0.1.0.dist-info/licenses/LICENSE"} <= names
    assert "License-Expression: Apache-2.0 AND MIT" in meta.splitlines()
    requires = [line.split(": ", 1)[1] for line in meta.splitlines()
                if line.startswith("Requires-Dist: ")]
    unconditional = sorted(re.split(r"[<>=\[; ]", r)[0] for r in requires if ";" not in r)
    assert unconditional == ["pydantic", "websockets"]
    assert not [r for r in requires if r.startswith("plotly")]
    assert 'torch>=2.1; extra == "torch"' in requires


def test_the_image_pins_a_version_of_each_requirement_of_the_server_extra(dist: Dist) -> None:
    pins = {}
    for line in (ROOT / "docker" / "requirements.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"docker/requirements.txt: {line!r} is not pinned with =="
            pins[canonicalize_name(name)] = version
    with zipfile.ZipFile(dist.wheel) as whl:
        meta = whl.read("gradwatch-0.1.0.dist-info/METADATA").decode()
    wanted = [Requirement(line.split(": ", 1)[1]) for line in meta.splitlines()
              if line.startswith("Requires-Dist: ")]
    server = [r for r in wanted if r.marker is None or r.marker.evaluate({"extra": "server"})]
    assert {canonicalize_name(r.name) for r in server} == {
        "pydantic", "websockets", "fastapi", "uvicorn"}
    for req in server:
        name = canonicalize_name(req.name)
        assert name in pins, f"docker/requirements.txt does not pin {name}"
        assert req.specifier.contains(pins[name]), f"{name}=={pins[name]} is not {req}"
    assert "plotly" not in pins and "torch" not in pins


def test_the_base_install_checks_logs_and_names_what_it_lacks(
        base: Venv, tmp_path: Path) -> None:
    log = write(tmp_path / "bug.jsonl", missed_reset_log())
    r = base.run("gradwatch", "check", str(log), cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    assert "missed_reset" in r.stdout

    r = base.run("python", "-c", "import gradwatch, gradwatch.check; gradwatch.watch",
                 cwd=tmp_path)
    assert r.returncode == 1
    assert r.stderr.splitlines()[-1] == (
        "gradwatch.extras.TorchMissingError: the gradwatch probe (gradwatch.watch) needs "
        "torch, which is not installed in this environment: install PyTorch where you train "
        "(pip install torch)")

    for command in ("serve", "demo"):
        r = base.run("gradwatch", command, cwd=tmp_path)
        assert r.returncode == 2
        assert ("needs the server extra (fastapi, uvicorn), which is not installed in this "
                "environment: pip install 'gradwatch[server]'") in r.stderr.splitlines()[0]
        assert "Traceback" not in r.stderr


def test_the_server_extra_serves_the_dashboard_without_torch(
        server: Venv, tmp_path: Path) -> None:
    r = server.run("python", "-c", "import importlib.util as u; "
                   "print(u.find_spec('torch'), u.find_spec('plotly'))", cwd=tmp_path)
    assert r.stdout.split() == ["None", "None"], r.stderr

    port = free_port()
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen([str(server.bin / "gradwatch"), "serve", "--port", str(port),
                             "--data", str(tmp_path / "data"), "--log-level", "warning"],
                            stdout=log, stderr=log, cwd=tmp_path, env=_clean_env())
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                urllib.request.urlopen(f"{base_url}/healthz", timeout=2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "gradwatch serve did not come up"
                time.sleep(0.1)
        with urllib.request.urlopen(f"{base_url}/", timeout=10) as page:
            assert page.status == 200
            assert '<link rel="preload" href="/static/vendor/plotly.min.js"' in page.read().decode()
        with urllib.request.urlopen(f"{base_url}/static/vendor/plotly.min.js", timeout=10) as js:
            assert js.status == 200
            assert js.headers["Cache-Control"] == "public, max-age=86400"
            assert js.read() == BUNDLE.read_bytes()
        with urllib.request.urlopen(f"{base_url}/static/js/main.js", timeout=10) as main:
            assert main.status == 200
    finally:
        proc.terminate()
        proc.wait(15)
        log.close()


def test_the_server_extra_adds_at_most_50_mib(bare: Venv, base: Venv, server: Venv) -> None:
    sizes = {v.root.name: _disk_bytes(v.site_packages()) for v in (bare, base, server)}
    added = sizes["server"] - sizes["bare"]
    assert added <= SERVER_EXTRA_BUDGET, (
        f"gradwatch[server] adds {added / MiB:.1f} MiB (base install adds "
        f"{(sizes['base'] - sizes['bare']) / MiB:.1f} MiB): over the "
        f"{SERVER_EXTRA_BUDGET // MiB} MiB budget")
