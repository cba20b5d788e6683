"""``gradwatch serve`` argument errors and imports, ``gradwatch replay``, and the names
``gradwatch run`` streams."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import synth

from tests.probe.test_probe_cli import GAN
from tests.serverproc import ServerProc


def gw(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gradwatch.cli", *args],
                          capture_output=True, text=True, timeout=timeout)


def write_log(path: Path, steps: int = 40, stale_from: int | None = 20) -> Path:
    path.write_text(synth.log_text(synth.records(steps=steps, stale_from=stale_from)))
    return path


@pytest.mark.parametrize(("args", "message"), [
    (["--port", "70000"], "not a port number"),
    (["--host", "0.0.0.0"], "requires --token"),
    (["--data", "/proc/gradwatch-nope"], "not writable"),
])
def test_serve_refuses_bad_arguments_with_exit_2(args: list[str], message: str,
                                                 tmp_path: Path) -> None:
    extra = [] if "--data" in args else ["--data", str(tmp_path / "d")]
    r = gw("serve", *args, *extra)
    assert r.returncode == 2 and message in r.stderr, r.stderr


def test_serve_import_names_the_bad_line(tmp_path: Path) -> None:
    log = write_log(tmp_path / "run.jsonl")
    lines = log.read_text().splitlines()
    lines[5] = lines[5][:-3] + "oops"
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    r = gw("serve", "--data", str(tmp_path / "d"), "--import", str(bad), "--import-only")
    assert r.returncode == 2 and f"{bad}:6:" in r.stderr, r.stderr
    r = gw("serve", "--data", str(tmp_path / "d"), "--import", str(log), "--import-only")
    assert r.returncode == 0 and "as run run1 (40 steps)" in r.stdout, r.stderr
    with ServerProc(tmp_path / "d") as srv:
        assert srv.get("/api/runs/run1")["status"] == "finished"
        assert srv.get("/api/runs/run1/findings")["findings"][0]["first_step"] == 20


def test_replay_sends_a_log_as_a_new_run(tmp_path: Path) -> None:
    log = write_log(tmp_path / "run.jsonl", steps=300)
    with ServerProc(tmp_path / "d") as srv:
        r = gw("replay", str(log), "--server", srv.ws, "--fast", "--name", "again")
        assert r.returncode == 0, r.stderr
        run = next(line.split()[-1] for line in r.stdout.splitlines()
                   if line.startswith("sent "))
        assert f"http://127.0.0.1:{srv.port}/?run={run}" in r.stdout
        got = srv.get(f"/api/runs/{run}")
        assert got["name"] == "again" and got["steps"] == 300 and got["status"] == "finished"
        assert srv.get(f"/api/runs/{run}/findings")["findings"][0]["first_step"] == 20
        # at recorded pace x10: the 3 s log (steps 10 ms apart) takes about 0.3 s
        r = gw("replay", str(log), "--server", srv.ws, "--speed", "10")
        assert r.returncode == 0, r.stderr
        assert len(srv.get("/api/runs")["runs"]) == 2


def test_two_replays_of_one_log_read_apart_in_the_run_list(tmp_path: Path) -> None:
    log = write_log(tmp_path / "run.jsonl", steps=10)
    with ServerProc(tmp_path / "d") as srv:
        for _ in range(2):
            assert gw("replay", str(log), "--server", srv.ws, "--fast").returncode == 0
        names = sorted(r["name"] for r in srv.get("/api/runs")["runs"])
    assert len(set(names)) == 2, names
    assert all(n.startswith("run1 (replay ") for n in names), names


def test_replay_of_an_invalid_log_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("hello\n")
    r = gw("replay", str(bad), "--fast")
    assert r.returncode == 2 and "bad.jsonl:1" in r.stderr, r.stderr


@pytest.mark.parametrize(("args", "words"), [
    (["--server", "ws://127.0.0.1:99999"], "port must be a number from 1 to 65535"),  # traceback
    (["--server", "ws://"], "has no host"),  # was "Connection refused"
    (["--speed", "nan"], "--speed must be a positive number"),  # was taken as a pace
    (["--timeout", "-1"], "--timeout must be 0 or more"),  # gave up at once, "not acked"
])
def test_replay_refuses_a_bad_server_url_or_pace_as_a_usage_error(
        tmp_path: Path, args: list[str], words: str) -> None:
    r = gw("replay", str(write_log(tmp_path / "run.jsonl", steps=5)), *args)
    assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_replay_into_a_server_that_is_not_gradwatch_says_so(tmp_path: Path) -> None:
    import http.server
    import threading

    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    try:
        r = gw("replay", str(write_log(tmp_path / "run.jsonl", steps=5)), "--fast",
               "--timeout", "2", "--server", f"ws://127.0.0.1:{web.server_address[1]}")
    finally:
        web.shutdown()
        web.server_close()
    assert r.returncode == 1, r.stderr
    assert "sent 0 of" in r.stderr and "is a gradwatch server listening there?" in r.stderr


def test_run_streams_the_names_the_script_uses(tmp_path: Path) -> None:
    """``gradwatch run --server``: the server's findings and optimizers carry the variable
    names (``od``, ``D.0.weight``), the records keep the ids (``Adam#1``)."""
    script = tmp_path / "gan.py"
    script.write_text(GAN)
    with ServerProc(tmp_path / "d") as srv:
        r = subprocess.run([sys.executable, "-m", "gradwatch", "run", "--server", srv.ws,
                            "--log", str(tmp_path / "gan.jsonl"), "--", str(script)],
                           capture_output=True, text=True, timeout=120,
                           env={**os.environ, "GRADWATCH_RUN_ID": "gan-names"})
        assert r.returncode == 0, r.stderr
        # the run's own page, printed as it starts (with --log too)
        assert (f"gradwatch: the run, live on the dashboard: http://127.0.0.1:{srv.port}"
                f"/?run=gan-names") in r.stderr.splitlines(), r.stderr
        run = srv.get("/api/runs/gan-names")
        assert [(o["opt"], o["label"], o["params"]) for o in run["optimizers"]] == [
            ("Adam#0", "og", ["G.net.weight", "G.net.bias"]),
            ("Adam#1", "od", ["D.0.weight", "D.0.bias"])]
        [f] = srv.get("/api/runs/gan-names/findings")["findings"]
        assert (f["kind"], f["optimizer"], f["params"]) == (
            "cross_optimizer_leak", "od", ["D.0.weight", "D.0.bias"])
