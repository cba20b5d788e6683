"""The terminal as a user meets it: no silent failure, no traceback for a Ctrl-C, help that
reads as help, output that ends quietly in a pipe."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import synth

from tests.serverproc import ServerProc, free_port

CLI = [sys.executable, "-m", "gradwatch.cli"]
FAULTHANDLER = {**os.environ, "PYTHONFAULTHANDLER": "1"}
"""A process's environment in which SIGABRT prints every thread's stack (:meth:`Output.done`)."""


def _as_a_terminal_starts_it() -> None:
    """In the child before exec: SIGINT unblocked and at its default, as a shell starts a
    foreground job, whatever the test worker's own state (a signal mask and an ignored
    disposition survive exec). Two full suites on 2026-11-28 showed a serve that never saw
    the Ctrl-C, idle in uvicorn; no test was found to leave the worker's mask or handler
    changed (checked after every test of the suite), so that cause is not shown."""
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Output:
    """A process's merged output, read on a thread; ``mark()`` notes how much was printed."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc, self.text = proc, ""
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.text += line

    def wait_for(self, part: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while part not in self.text:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise AssertionError(f"never printed {part!r}:\n{self.text}")
            time.sleep(0.05)

    def done(self, timeout: float = 30.0) -> str:
        """The whole output once the process ended; past ``timeout`` the process (started
        with :data:`FAULTHANDLER`) is made to print every thread's stack, and that fails
        the test: where it waits is what a hang's report needs."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGABRT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
            self._thread.join(5)
            raise AssertionError(f"still running {timeout:.0f} s later:\n{self.text}"
                                 ) from None
        self._thread.join(5)
        return self.text


def _ctrl_c(proc: subprocess.Popen[str]) -> None:
    """What a terminal does on Ctrl-C: SIGINT to the whole foreground process group."""
    os.killpg(proc.pid, signal.SIGINT)


def _parser_python_started(server: subprocess.Popen[str]) -> bool:
    """Whether a frame parser process of the server runs Python: it has set up its SIGINT
    disposition (Python's KeyboardInterrupt handler while it imports, then ignored)."""
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines())
            cmd = (status.parent / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        sigint = 1 << (signal.SIGINT - 1)
        if (int(fields["PPid"]) == server.pid and b"spawn_main" in cmd
                and (int(fields["SigCgt"], 16) | int(fields["SigIgn"], 16)) & sigint):
            return True
    return False


@pytest.mark.parametrize("moment", ["importing", "building the app", "parsers starting",
                                    "serving"])
def test_ctrl_c_at_any_moment_of_serve_start_up_prints_one_line(tmp_path: Path,
                                                                 moment: str) -> None:
    """Ctrl-C while ``serve`` starts: its parser processes are still importing (they get
    the signal too, with the whole process group) or the app is not built yet. Each moment
    ends in the same one line and exit 0, whatever the machine's load."""
    port = free_port()
    proc = subprocess.Popen([*CLI, "serve", "--port", str(port), "--data",
                             str(tmp_path / "d"), "--parse-processes", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env=FAULTHANDLER,
                            preexec_fn=_as_a_terminal_starts_it)
    out = Output(proc)
    try:
        if moment == "building the app":
            out.wait_for("gradwatch: dashboard at")
        elif moment == "parsers starting":
            deadline = time.monotonic() + 60
            while not _parser_python_started(proc):
                assert proc.poll() is None and time.monotonic() < deadline, out.text
                time.sleep(0.01)
        elif moment == "serving":
            out.wait_for("Uvicorn running on")
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/runs", timeout=10):
                pass
        _ctrl_c(proc)
        text = out.done(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    if moment == "importing" and proc.returncode == -signal.SIGINT:
        assert text == ""  # the signal came before Python handled it: killed, silently
        return
    if moment == "importing" and text.startswith("Fatal Python error: init_import_site"):
        # The signal came while the interpreter itself was starting (its site module),
        # before any gradwatch code ran: CPython's own message, not ours to shape.
        assert "gradwatch/" not in text.split("__editable__")[0], text
        return
    assert proc.returncode == 0, text
    lines = text.strip().splitlines()
    # Start-up lines printed before the signal was handled may precede the one stop line
    # (uvicorn ends its start-up before it stops); nothing else may: no traceback, no
    # warning, no line from a parser process.
    assert lines[-1] == "gradwatch serve: stopped", text
    assert all(line.startswith(START_UP_LINES) for line in lines[:-1]), text


START_UP_LINES = ("gradwatch: dashboard at ", "INFO:     Started server process",
                  "INFO:     Waiting for application startup.",
                  "INFO gradwatch.server.app: gradwatch server: data in ",
                  "INFO:     Application startup complete.", "INFO:     Uvicorn running on ")


def test_access_log_is_off_unless_asked(tmp_path: Path) -> None:
    for extra, logged in (((), False), (("--access-log",), True)):
        with ServerProc(tmp_path / f"d{logged}", None, "--log-level", "info", *extra) as srv:
            srv.get("/api/runs")
            time.sleep(0.3)
        assert ("GET /api/runs" in srv.log.read_text()) is logged


def test_ctrl_c_on_demo_prints_one_line(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen([*CLI, "demo", "--port", str(port), "--data", str(tmp_path / "d"),
                             "--steps-per-phase", "100000", "--pace", "0.01"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env=FAULTHANDLER,
                            preexec_fn=_as_a_terminal_starts_it)
    out = Output(proc)
    try:
        out.wait_for("phase 'correct'", timeout=120)
        time.sleep(1.0)
        before = len(out.text)
        _ctrl_c(proc)
        text = out.done(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    after = text[before:]
    assert proc.returncode == 0
    assert after.strip().splitlines() == ["demo: stopped"], after


def test_replay_to_an_unreachable_server_says_so_and_exits(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    log.write_text(synth.log_text(synth.records(steps=5)))
    url = f"ws://127.0.0.1:{free_port()}"  # nothing listens there
    r = subprocess.run([*CLI, "replay", str(log), "--server", url], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1
    assert f"cannot reach the server at {url}" in r.stderr and "Traceback" not in r.stderr


SCRIPT = textwrap.dedent("""
    import sys, time, torch
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(5):
        opt.zero_grad()
        model(torch.randn(4, 3)).sum().backward()
        opt.step()
    time.sleep(4)  # training goes on while the server is unreachable
    print("script: done", file=sys.stderr, flush=True)
""")


def test_run_with_an_unreachable_server_warns_and_keeps_its_spool_out_of_the_cwd(
        tmp_path: Path) -> None:
    work, spool = tmp_path / "work", tmp_path / "spool"
    work.mkdir()
    (work / "train.py").write_text(SCRIPT)
    url = f"ws://127.0.0.1:{free_port()}"
    env = {**os.environ, "GRADWATCH_SPOOL_DIR": str(spool), "GRADWATCH_RUN_ID": "unreach"}
    r = subprocess.run([*CLI, "run", "--server", url, "--", "train.py"], cwd=work,
                       capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 0, r.stderr
    warned = r.stderr.find(f"cannot reach the server at {url}")
    assert 0 <= warned < r.stderr.index("script: done"), r.stderr  # said while it trained
    assert list(work.iterdir()) == [work / "train.py"]  # no step log left in the cwd
    assert str(spool / "unreach.jsonl") in r.stderr
    assert (spool / "unreach.jsonl").is_file()


def test_check_ends_quietly_when_its_reader_stops(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    log.write_text(synth.log_text(synth.records(steps=2000, stale_from=10)))
    proc = subprocess.Popen([*CLI, "check", str(log)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # `| head` that has read enough: every write now fails
    err = proc.stderr.read().decode()
    assert proc.wait(60) == 1  # still the verdict's exit code: findings
    assert err == ""


@pytest.mark.parametrize("cmd", ["check", "replay", "run", "serve", "demo"])
def test_help_reads_as_help(cmd: str) -> None:
    r = subprocess.run([*CLI, cmd, "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    assert "``" not in r.stdout and ":class:" not in r.stdout
    want = {"replay": "(default: ws://127.0.0.1:8765)", "run": "(default: 1)",
            "serve": "(default: info)", "demo": "(default: 0.04)",
            "check": "LOG"}[cmd]
    assert want in r.stdout


def test_argument_errors_come_before_file_checks(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.jsonl")
    r = subprocess.run([*CLI, "replay", missing, "--server", "ftp://x"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "--server" in r.stderr and "missing" not in r.stderr
    r = subprocess.run([*CLI, "run", "--norms-every", "-1", "--", str(tmp_path / "no.py")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--norms-every" in r.stderr and "not found" not in r.stderr
