"""The README's main job, ``gradwatch demo``, end to end: server, probe, findings."""

from __future__ import annotations

import contextlib
import http.client
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_demo_streams_a_run_whose_findings_match_its_phases(tmp_path: Path) -> None:
    """Also on the port a server has just left (TIME-WAIT): the demo starts at once, as
    serve does; the port is tested the way the server binds it."""
    port = free_port()
    _leave_time_wait(port, tmp_path / "before")
    r = subprocess.run(
        [sys.executable, "-m", "gradwatch.cli", "demo", "--once", "--port", str(port),
         "--data", str(tmp_path / "data"), "--steps-per-phase", "20", "--pace", "0"],
        capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "in use" not in r.stderr
    assert f"http://127.0.0.1:{port}/" in r.stdout
    # the run's own page is printed as it starts: the link opens its live charts
    link = next(line for line in r.stdout.splitlines() if line.startswith("demo: this run"))
    with contextlib.closing(sqlite3.connect(tmp_path / "data" / "gradwatch.db")) as db:
        runs = db.execute("SELECT id FROM runs").fetchall()
    assert len(runs) == 1 and link.endswith(f"http://127.0.0.1:{port}/?run={runs[0][0]}"), (
        link, runs)
    findings = [line for line in r.stdout.splitlines() if line.startswith("demo: finding")]
    kinds = {line.split()[2] for line in findings}
    # The forgotten zero_grad phase starts at step 20, the late reset phase at step 40;
    # intentional accumulation (steps 60-79) must stay clean.
    assert kinds == {"missed_reset", "late_reset"}, r.stdout
    # named as the demo's code holds its optimizer (its loop is the user's code, not ours)
    assert all(line.split()[3:5] == ["on", "opt"] for line in findings), findings
    assert any("missed_reset" in f and "from step 20" in f for f in findings), findings
    assert any("late_reset" in f and "from step 40" in f for f in findings), findings
    assert (tmp_path / "data").is_dir()


def test_demo_refuses_a_bad_port() -> None:
    r = subprocess.run([sys.executable, "-m", "gradwatch.cli", "demo", "--port", "70000"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--port must be 1-65535" in r.stderr


@pytest.mark.parametrize(("args", "words"), [
    (["--pace", "-1"], "--pace must be 0 or more"),  # a traceback from time.sleep, mid-run
    (["--host", "bad..host"], "not an address or a name"),  # a traceback from getaddrinfo
])
def test_demo_refuses_a_bad_pace_or_host_before_it_starts(
        tmp_path: Path, args: list[str], words: str) -> None:
    r = subprocess.run([sys.executable, "-m", "gradwatch.cli", "demo", "--once", *args,
                        "--port", str(free_port()), "--data", str(tmp_path / "d")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert "dashboard" not in r.stdout


def test_sigterm_stops_the_demo_and_its_server(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gradwatch.cli", "demo", "--port", str(port), "--data",
         str(tmp_path / "data"), "--steps-per-phase", "5", "--pace", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # wait until the training is done and it only serves
            if "Ctrl-C to stop" in line:
                break
        proc.terminate()
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    time.sleep(0.5)
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)
        raise AssertionError("the server outlived the demo")
    except OSError:
        pass


def _time_wait_on(port: int) -> int:
    """Connections in TIME-WAIT whose local port is ``port`` (Linux: /proc/net/tcp)."""
    n = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            n += state == "06" and int(local.rsplit(":", 1)[1], 16) == port
    return n


def _leave_time_wait(port: int, data: Path) -> None:
    """Start a server on ``port`` and stop it with a connection open: it closes that
    connection first, which leaves the port's side of it in TIME-WAIT for a minute while
    nothing listens (a demo stopped and started again)."""
    serve = subprocess.Popen([sys.executable, "-m", "gradwatch.cli", "serve", "--port",
                              str(port), "--data", str(data), "--log-level", "warning",
                              "--parse-processes", "0"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        while True:
            try:
                conn.request("GET", "/healthz")
                conn.getresponse().read()  # keep-alive: the connection stays open
                break
            except OSError:
                conn.close()
                assert serve.poll() is None, "the first server did not start"
                time.sleep(0.05)
        serve.send_signal(signal.SIGINT)  # the server closes the open connection first
        assert serve.wait(timeout=30) == 0
        conn.close()
    finally:
        if serve.poll() is None:
            serve.kill()
    assert _time_wait_on(port) > 0


def test_demo_refuses_a_port_something_listens_on(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "gradwatch.cli", "demo", "--once", "--port",
                            str(port), "--data", str(tmp_path / "d")],
                           capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert f"port {port} on 127.0.0.1 is in use" in r.stderr
