"""When records never reach the server, the probe says how many, where they are and how to
send them; ``gradwatch replay --resume`` then completes the same run."""

from __future__ import annotations

import logging
import os
import re
import shlex
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import synth

from tests.serverproc import ServerProc, free_port

TRAIN = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import torch
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    half, go = Path(sys.argv[1]), Path(sys.argv[2])
    for i in range(200):
        if i == 100:  # the test kills the server here
            half.touch()
            deadline = time.monotonic() + 60
            while not go.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        if i < 150:
            opt.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()
        time.sleep(0.002)
""")


def gw(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gradwatch.cli", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_a_run_whose_server_died_says_what_is_missing_and_replay_resume_completes_it(
        tmp_path: Path) -> None:
    pytest.importorskip("torch")
    script, log = tmp_path / "train.py", tmp_path / "run.jsonl"
    half, go = tmp_path / "half", tmp_path / "go"
    script.write_text(TRAIN)
    srv = ServerProc(tmp_path / "data").start()
    try:
        run = subprocess.Popen(
            [sys.executable, "-m", "gradwatch.cli", "run", "--server", srv.ws, "--log",
             str(log), "--", str(script), str(half), str(go)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "GRADWATCH_RUN_ID": "cut-short"})
        deadline = time.monotonic() + 90
        while not half.exists():
            assert time.monotonic() < deadline and run.poll() is None
            time.sleep(0.05)
        # The first half reaches the server (stored, so acked) before it dies.
        while srv.get("/api/runs").get("runs") == [] or \
                srv.get("/api/runs/cut-short")["steps"] == 0:
            assert time.monotonic() < deadline and run.poll() is None
            time.sleep(0.05)
        srv.kill9()
        go.touch()
        _, err = run.communicate(timeout=120)
        assert run.returncode == 0, err
        written = len(log.read_text().splitlines())
        m = re.search(r"did not acknowledge (\d+) records of run cut-short; they are in "
                      r"(\S+)\. Send them with: (gradwatch replay .+ --resume --server \S+)",
                      err)
        assert m, err
        missing, where, command = int(m.group(1)), m.group(2), m.group(3)
        assert where == str(log) and 50 < missing < written
        assert err.count("did not acknowledge") == 1  # the verdict says it once
        srv.start()
        had = srv.get("/api/runs/cut-short")["steps"]
        assert 0 < had < 200
        r = gw(*shlex.split(command)[1:])
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"now holds all {written}" in r.stdout
        got = srv.get("/api/runs/cut-short")
        assert got["steps"] == 200 and got["status"] == "finished"
        steps = srv.get("/api/runs/cut-short/steps?max_points=100000")["step"]
        assert steps == list(range(200))  # every step once, in the same run
        findings = srv.get("/api/runs/cut-short/findings")["findings"]
        assert [(f["kind"], f["first_step"]) for f in findings] == [("missed_reset", 150)]
        assert len(srv.get("/api/runs")["runs"]) == 1  # no second run
    finally:
        srv.stop()


def test_watch_reports_unsent_records_on_the_handle_and_in_its_log(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    torch = pytest.importorskip("torch")
    import gradwatch

    server = f"ws://127.0.0.1:{free_port()}"  # nobody listens
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with caplog.at_level(logging.WARNING, logger="gradwatch.probe"), \
            gradwatch.watch(opt, model=model, server=server, log=tmp_path / "r.jsonl",
                            run_id="nowhere") as h:
        for _ in range(5):
            opt.zero_grad()
            model(torch.randn(2, 3)).sum().backward()
            opt.step()
    lines = (tmp_path / "r.jsonl").read_text().splitlines()
    assert h.unsent == len(lines)  # header, optimizer, 5 steps, stats, end
    assert h.unsent_report() in caplog.text
    assert f"did not acknowledge {len(lines)} records of run nowhere" in caplog.text
    assert f"replay {tmp_path / 'r.jsonl'} --resume --server {server}" in caplog.text


def test_replay_resume_sends_only_what_the_server_lacks(tmp_path: Path) -> None:
    recs = synth.records("half-there", steps=300)
    log = tmp_path / "run.jsonl"
    log.write_text(synth.log_text(recs))
    # A run whose stream ended without End reads as live until --interrupted-after (1 s
    # in ServerProc): longer here, so a loaded machine's slow exit of the first replay
    # cannot turn "live" into "interrupted" before the test reads it.
    with ServerProc(tmp_path / "data", None, "--interrupted-after", "600") as srv:
        first = tmp_path / "first.jsonl"
        first.write_text(synth.log_text(recs[:120]))
        r = gw("replay", str(first), "--server", srv.ws, "--resume")
        assert r.returncode == 0, r.stderr
        assert srv.get("/api/runs/half-there")["status"] == "live"
        r = gw("replay", str(log), "--server", srv.ws, "--resume")
        assert r.returncode == 0, r.stderr
        assert f"the server had 120 records, sent {len(recs) - 120}" in r.stdout
        got = srv.get("/api/runs/half-there")
        assert got["steps"] == 300 and got["status"] == "finished"
        assert gw("replay", str(log), "--server", srv.ws, "--resume", "--name",
                  "x").returncode == 2
        down = gw("replay", str(log), "--server", f"ws://127.0.0.1:{free_port()}",
                  "--resume", "--timeout", "1")
        assert down.returncode == 1 and "cannot reach the server at ws://127.0.0.1:" \
            in down.stderr  # said at once, naming the server (issue 24)
