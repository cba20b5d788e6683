"""The package as users install it: the README's own Install lines, read from README.md and
run as written (``bash -c``) in a fresh copy of this checkout, each into a fresh virtual
environment that has no torch.

``pip install .`` gives the probe's torch error, ``check`` and the install hints;
``pip install '.[server]'`` serves the dashboard and adds at most 50 MiB; ``make dist``
builds a wheel that installs the same way. pip's cache (warm after scripts/setup.sh) keeps
the installs to seconds.
"""

from __future__ import annotations

import os
import re
import shutil
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

# One worker builds and installs everything this module's tests share (xdist: loadgroup).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("packaging")]

MiB = 1 << 20
SERVER_EXTRA_BUDGET = 50 * MiB
"""Most a torch-free ``gradwatch[server]`` may add to a fresh virtual environment."""


def install_blocks(readme: Path = ROOT / "README.md") -> list[list[str]]:
    """The command lines of the bash blocks of the README's Install section, as written
    (comments and blank lines left out)."""
    text = readme.read_text()
    section = text[text.index("\n## Install\n"):]
    section = section[:section.index("\n## ", 1)]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    return [[line.split(" #", 1)[0].strip() for line in block.splitlines()
             if line.strip() and not line.lstrip().startswith("#")] for block in blocks]


@dataclass
class Dist:
    wheel: Path
    sdist: Path
    log: str
    """What ``python -m build`` printed (the build backend's output included)."""


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


def run_line(line: str, cwd: Path, venv: Venv | None = None) -> str:
    """A README line as a user runs it: in a shell, with ``venv`` active; its output."""
    env = _clean_env()
    if venv is not None:
        env["VIRTUAL_ENV"] = str(venv.root)
        env["PATH"] = f"{venv.bin}{os.pathsep}{env.get('PATH', '')}"
    r = subprocess.run(["bash", "-c", line], capture_output=True, text=True, cwd=cwd,
                       env=env, timeout=600)
    assert r.returncode == 0, f"README line {line!r} failed:\n{r.stdout}{r.stderr}"
    return r.stdout + r.stderr


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # Byte-compiling is a normal part of a build and an install; the suite's environment
    # may switch it off, which setuptools reports as a warning.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _venv(template: Path, path: Path) -> Venv:
    """A fresh virtual environment at ``path``: a copy of ``template`` (a fresh
    ``python -m venv``) with its own path in its scripts and pyvenv.cfg, what ``python -m
    venv path`` makes, without installing and byte-compiling pip again (seconds each)."""
    shutil.copytree(template, path, symlinks=True)
    old, new = str(template).encode(), str(path).encode()
    for f in [path / "pyvenv.cfg", *(path / "bin").iterdir()]:
        if f.is_file() and not f.is_symlink() and old in (data := f.read_bytes()):
            f.write_bytes(data.replace(old, new))
    venv = Venv(path)
    # its pip installs into it, not into the template
    r = venv.run("pip", "--version", cwd=path)
    assert f"{path}/lib/" in r.stdout, r.stdout + r.stderr
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


@pytest.fixture(scope="session")
def readme_lines() -> tuple[list[str], list[str]]:
    """``(from the checkout, from a wheel)``: the README's two Install blocks."""
    blocks = install_blocks()
    assert len(blocks) == 2 and len(blocks[0]) == 2 and len(blocks[1]) == 2, blocks
    return blocks[0], blocks[1]


@pytest.fixture(scope="session")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh copy of this checkout's files (what a clone has), so builds write nothing
    into the working tree."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                            "--exclude-standard"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    copy = tmp_path_factory.mktemp("clone") / "gradwatch"
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    return copy


@pytest.fixture(scope="session")
def dist(checkout: Path, readme_lines: tuple[list[str], list[str]]) -> Dist:
    out = run_line(readme_lines[1][0], cwd=checkout)  # no venv active: make makes its own
    built = checkout / "dist"
    # What ``python -m build`` printed; make's venv set-up before it is pip's business.
    log = out[out.index("* Creating"):]
    return Dist(wheel=next(built.glob("gradwatch-*.whl")),
                sdist=next(built.glob("gradwatch-*.tar.gz")), log=log)


@pytest.fixture(scope="session")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The one ``python -m venv`` the fresh environments below are copies of."""
    path = tmp_path_factory.mktemp("venv") / "template"
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=120)
    return path


@pytest.fixture(scope="session")
def bare(tmp_path_factory: pytest.TempPathFactory, template: Path) -> Venv:
    return _venv(template, tmp_path_factory.mktemp("venv") / "bare")


def _installed(factory: pytest.TempPathFactory, template: Path, name: str, line: str,
               checkout: Path) -> Venv:
    """A fresh venv ``name`` that a README line installed into, run in the checkout."""
    venv = _venv(template, factory.mktemp("venv") / name)
    run_line(line, cwd=checkout, venv=venv)
    return venv


@pytest.fixture(scope="session")
def base(tmp_path_factory: pytest.TempPathFactory, template: Path, checkout: Path,
         readme_lines: tuple[list[str], list[str]]) -> Venv:
    return _installed(tmp_path_factory, template, "base", readme_lines[0][0], checkout)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory, template: Path, checkout: Path,
           readme_lines: tuple[list[str], list[str]]) -> Venv:
    return _installed(tmp_path_factory, template, "server", readme_lines[0][1], checkout)


@pytest.fixture(scope="session")
def wheel_server(tmp_path_factory: pytest.TempPathFactory, template: Path, checkout: Path,
                 dist: Dist, readme_lines: tuple[list[str], list[str]]) -> Venv:
    return _installed(tmp_path_factory, template, "wheel", readme_lines[1][1], checkout)


def test_the_readme_installs_from_a_checkout_and_names_the_wheel_make_dist_builds(
        readme_lines: tuple[list[str], list[str]], dist: Dist) -> None:
    wheel_lines = readme_lines[1]
    assert wheel_lines[1] == f"pip install 'dist/{dist.wheel.name}[server]'"
    # A PyPI line may stay, in a paragraph that says it is for once gradwatch is published.
    for paragraph in (ROOT / "README.md").read_text().split("\n\n"):
        if re.search(r"pip install '?gradwatch\b", paragraph):
            assert "published" in paragraph, paragraph


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


def test_the_image_pins_a_version_of_each_requirement_of_the_server_and_postgres_extras(
        dist: Dist) -> None:
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
    # the team server's image (docker/compose.team.yaml) stores in PostgreSQL
    server = [r for r in wanted if r.marker is None or r.marker.evaluate({"extra": "server"})
              or r.marker.evaluate({"extra": "postgres"})]
    assert {canonicalize_name(r.name) for r in server} == {
        "pydantic", "websockets", "fastapi", "uvicorn", "psycopg"}
    for req in server:
        name = canonicalize_name(req.name)
        assert name in pins, f"docker/requirements.txt does not pin {name}"
        assert req.specifier.contains(pins[name]), f"{name}=={pins[name]} is not {req}"
    assert "plotly" not in pins and "torch" not in pins
    assert pins.get("psycopg-binary") == pins["psycopg"]  # psycopg[binary]: libpq inside


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
                "environment: pip install fastapi 'uvicorn[standard]'") in r.stderr.splitlines()[0]
        assert "Traceback" not in r.stderr


@pytest.mark.parametrize("installed", ["server", "wheel_server"])
def test_the_server_extra_serves_the_dashboard_without_torch(
        installed: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    server: Venv = request.getfixturevalue(installed)
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
