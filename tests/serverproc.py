"""A real ``gradwatch serve`` process on 127.0.0.1, for the e2e and browser tests and benches."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProc:
    """Start, query, kill -9 and restart a server on a fixed port and data dir."""

    def __init__(self, data: Path, port: int | None = None, *extra: str):
        self.data = data
        self.port = port or free_port()
        self.extra = list(extra)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = data.parent / f"server-{self.port}.log"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> ServerProc:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        fh = self.log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gradwatch.cli", "serve", "--port", str(self.port),
             "--data", str(self.data), "--log-level", "warning",
             "--interrupted-after", "1", *self.extra], stdout=fh, stderr=fh, env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}: "
                                   f"{self.log.read_text()[-2000:]}")
            try:
                self.get("/healthz")
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("server did not come up")

    def get(self, path: str, token: str | None = None) -> Any:
        req = urllib.request.Request(self.http + path)
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    def children(self) -> list[int]:
        """Pids of the server's child processes (its frame parsers)."""
        if self.proc is None:
            return []
        out = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == self.proc.pid:
                out.append(int(stat.parent.name))
        return out

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def __enter__(self) -> ServerProc:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
