"""The README's main job, ``gradwatch demo``, end to end: server, probe, findings."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_demo_streams_a_run_whose_findings_match_its_phases(tmp_path: Path) -> None:
    port = free_port()
    r = subprocess.run(
        [sys.executable, "-m", "gradwatch.cli", "demo", "--once", "--port", str(port),
         "--data", str(tmp_path / "data"), "--steps-per-phase", "20", "--pace", "0"],
        capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"http://127.0.0.1:{port}/" in r.stdout
    findings = [line for line in r.stdout.splitlines() if line.startswith("demo: finding")]
    kinds = {line.split()[2] for line in findings}
    # The forgotten zero_grad phase starts at step 20, the late reset phase at step 40;
    # intentional accumulation (steps 60-79) must stay clean.
    assert kinds == {"missed_reset", "late_reset"}, r.stdout
    assert any("missed_reset" in f and "from step 20" in f for f in findings), findings
    assert any("late_reset" in f and "from step 40" in f for f in findings), findings
    assert (tmp_path / "data").is_dir()


def test_demo_refuses_a_bad_port() -> None:
    r = subprocess.run([sys.executable, "-m", "gradwatch.cli", "demo", "--port", "70000"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--port must be 1-65535" in r.stderr


def test_sigterm_stops_the_demo_and_its_server(tmp_path: Path) -> None:
    import time
    import urllib.request

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
