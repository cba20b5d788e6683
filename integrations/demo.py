"""``gradwatch demo``: the main job. Server + dashboard + a demo training streaming into it.

It starts ``gradwatch serve`` on the embedded default (SQLite in a data directory), prints
the dashboard URL, and trains a small network through four phases so a new user sees the
bug class within seconds: a correct loop, a forgotten ``zero_grad`` (drift climbs, a
``missed_reset`` finding appears), a reset between ``backward()`` and ``step()``
(``late_reset``), then intentional gradient accumulation, which stays clean. The server
keeps running until Ctrl-C.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gradwatch.cliargs import CommandParser, summary
from gradwatch.replay import dashboard_url
from gradwatch.server.cli import listen_problem

log = logging.getLogger("gradwatch.demo")

PHASES = ("correct", "forgot_zero_grad", "late_reset", "accumulation")


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode} before it "
                               f"was ready (see its messages above)")
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"the server did not answer {url}/healthz within {timeout:.0f} s")


def start_server(host: str, port: int, data: Path) -> subprocess.Popen[bytes]:
    """Start ``gradwatch serve`` as a child process and wait until it is healthy.

    The child runs in a session of its own: Ctrl-C reaches the demo alone, which stops the
    server itself (one line on the terminal, not one per process), and it logs warnings
    only, so the demo's lines stay readable."""
    cmd = [sys.executable, "-m", "gradwatch.cli", "serve", "--host", host, "--port",
           str(port), "--data", str(data), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL)
    try:
        _wait_healthy(f"http://{host}:{port}", proc)
    except BaseException:
        stop_server(proc)
        raise
    return proc


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def train(server: str | None, steps_per_phase: int, pace: float, log_path: Path | None,
          run_name: str) -> str:
    """Train a small MLP through the four demo phases under the probe; return the run id."""
    import torch

    import gradwatch

    torch.manual_seed(0)
    teacher = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                                  torch.nn.Linear(32, 1))
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def loss_of_batch(scale: float = 1.0) -> torch.Tensor:
        x = torch.randn(64, 16)
        with torch.no_grad():
            y = teacher(x)
        return torch.nn.functional.mse_loss(model(x), y) * scale

    handle = gradwatch.watch(opt, model=model, server=server, log=log_path,
                             run_name=run_name)
    if server is not None:  # the run's own page: its charts live, no run to pick first
        print(f"demo: this run, live: {dashboard_url(server, handle.run_id)}", flush=True)
    try:
        for phase in PHASES:
            print(f"demo: phase '{phase}' ({steps_per_phase} steps)", flush=True)
            for i in range(steps_per_phase):
                if phase == "correct":
                    opt.zero_grad()
                    loss = loss_of_batch()
                    loss.backward()
                    opt.step()
                elif phase == "forgot_zero_grad":  # the bug: gradients pile up
                    loss = loss_of_batch()
                    loss.backward()
                    opt.step()
                elif phase == "late_reset":  # the bug: the reset wipes the fresh gradient
                    loss = loss_of_batch()
                    loss.backward()
                    opt.zero_grad()
                    opt.step()
                else:  # intentional accumulation over 4 micro-batches: clean
                    opt.zero_grad()
                    for _ in range(4):
                        loss = loss_of_batch(0.25)
                        loss.backward()
                    opt.step()
                if i % 50 == 0:
                    print(f"demo:   step {i:4d}  loss {loss.item():.4f}", flush=True)
                time.sleep(pace)
    finally:
        handle.close()
    return str(getattr(handle, "run_id", ""))


def _findings(url: str, run_id: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{url}/api/runs/{run_id}/findings", timeout=5) as r:
        data: dict[str, Any] = json.load(r)
    return list(data["findings"])


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str]) -> int:
    parser = CommandParser(prog="gradwatch demo", description=summary(__doc__))
    parser.add_argument("--host", default="127.0.0.1", help="address the server binds")
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADWATCH_PORT", 8765)),
                        help="the server's port (or GRADWATCH_PORT)")
    parser.add_argument("--data", type=Path, default=Path(os.environ.get(
        "GRADWATCH_DATA", "gradwatch-data")), help="data directory (SQLite)")
    parser.add_argument("--steps-per-phase", type=int, default=150,
                        help="optimizer steps in each of the four phases")
    parser.add_argument("--pace", type=float, default=0.04,
                        help="seconds to sleep after each step, so the charts move visibly")
    parser.add_argument("--once", action="store_true",
                        help="exit after the demo training instead of serving until Ctrl-C")
    args = parser.parse_args(argv)
    if not 0 < args.port < 65536:
        parser.error(f"--port must be 1-65535, got {args.port}")
    if args.steps_per_phase < 1:
        parser.error("--steps-per-phase must be at least 1")
    if not args.pace >= 0:  # nan fails too
        parser.error(f"--pace must be 0 or more seconds, got {args.pace}")
    why = listen_problem(args.host, args.port)
    if why is not None:
        hint = " or GRADWATCH_PORT" if why.endswith("--port") else ""
        print(f"gradwatch demo: {why}{hint}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    url = f"http://{args.host}:{args.port}"
    # SIGTERM (docker stop, kill, a CI timeout) ends the demo like Ctrl-C, so the server
    # child is stopped too instead of being orphaned.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    proc = start_server(args.host, args.port, args.data)
    try:
        print(f"\n  gradwatch dashboard: {url}/\n", flush=True)
        run_id = train(f"ws://{args.host}:{args.port}", args.steps_per_phase, args.pace,
                       None, "demo: correct, forgot zero_grad, late reset, accumulation")
        time.sleep(1.0)  # let the streamer deliver the tail
        for f in _findings(url, run_id):
            print(f"demo: finding {f['kind']} on {f['optimizer']} from step {f['first_step']}"
                  f" ({f['steps']} steps): {f['message']}", flush=True)
        if args.once:
            return 0
        print(f"\ndemo: training done; the dashboard stays up at {url}/ (this run: "
              f"{dashboard_url(url, run_id)}) — Ctrl-C to stop.", flush=True)
        while proc.poll() is None:
            time.sleep(0.5)
        return proc.returncode or 0
    except KeyboardInterrupt:
        print("\ndemo: stopped", flush=True)
        return 0
    finally:
        with contextlib.suppress(KeyboardInterrupt):
            stop_server(proc)
