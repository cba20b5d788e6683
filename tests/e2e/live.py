"""A dashboard-like live client in a thread (websockets sync client)."""

from __future__ import annotations

import base64
import json
import os
import socket
import threading
import time
import urllib.request
from typing import Any

import synth
from websockets.sync.client import connect

from gradwatch.wire import Step


class LiveCollector(threading.Thread):
    """Watches one run on ``/ws/live`` and records every step row it receives."""

    def __init__(self, ws_base: str, run: str, token: str | None = None):
        super().__init__(daemon=True)
        q = f"?run={run}&max_points=100000" + (f"&token={token}" if token else "")
        self.url = f"{ws_base}/ws/live{q}"
        self.rows: list[tuple[int, str, int]] = []
        self.status: str | None = None
        self.decimated = False
        self._halt = threading.Event()
        self.error: BaseException | None = None

    def _take(self, steps: dict[str, Any]) -> None:
        self.rows += list(zip(steps["rank"], steps["opt"], steps["step"], strict=True))

    def run(self) -> None:
        try:
            with connect(self.url, open_timeout=5, max_size=None) as ws:
                snap = json.loads(ws.recv(timeout=10))
                assert snap["type"] == "snapshot", snap
                self._take(snap["steps"])
                self.status = snap["run"]["status"]
                while not self._halt.is_set():
                    try:
                        m = json.loads(ws.recv(timeout=0.2))
                    except TimeoutError:
                        continue
                    if m["type"] == "steps":
                        self._take(m["steps"])
                        self.decimated |= m["decimated"]
                    elif m["type"] == "run":
                        self.status = m["run"]["status"]
        except BaseException as e:  # reported by the test
            self.error = e

    def wait_for(self, n: int, status: str = "finished", timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not (
                len(set(self.rows)) >= n and self.status == status) and self.error is None:
            time.sleep(0.05)
        self._halt.set()
        self.join(5)


def wide_records(run: str, steps: int, groups: int) -> list[Any]:
    """A whole stream of ``steps`` steps of an optimizer with ``groups`` param groups (one
    parameter each), each step carrying every group's learning rate: big live rows, so
    that a few thousand steps fill a socket's buffers."""
    head, opt, end = synth.records(run, steps=0)
    opt = opt.model_copy(update={"params": [f"layers.{g}.weight" for g in range(groups)],
                                 "shapes": [[4]] * groups, "groups": list(range(groups))})
    lr = [1e-3 * 0.9 ** g + 1e-9 for g in range(groups)]  # full-precision floats
    out: list[Any] = [head, opt]
    for i in range(steps):
        out.append(synth.step(len(out), i, nparams=groups).model_copy(update={"lr": lr}))
    return [*out, end.model_copy(update={"seq": len(out), "steps": steps,
                                         "t": 1000.0 + 0.01 * (steps + 2)})]


def live_bytes(recs: list[Any]) -> int:
    """About how many bytes the steps of ``recs`` make in live frames (each row's columns
    as JSON)."""
    return sum(len(json.dumps([s.step, s.t, s.norm, s.fresh_norm, s.drift, s.opt, s.lr,
                               [{"how": r.how, "n": len(r.params)} for r in s.resets]]))
               for s in recs if isinstance(s, Step))


def stuck_client(port: int, path: str) -> socket.socket:
    """A websocket client that completes the handshake and then never reads."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a window that fills fast
    sock.connect(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                 f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                 f"Sec-WebSocket-Version: 13\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert b" 101 " in head.split(b"\r\n")[0], head
    return sock


class Pinger(threading.Thread):
    """Asks ``/healthz`` every ``every`` seconds and keeps each round trip: the server's
    event loop answers it, so a long round trip is a stalled loop."""

    def __init__(self, http_base: str, every: float = 0.05):
        super().__init__(daemon=True)
        self.url = f"{http_base}/healthz"
        self.every = every
        self.rtts: list[float] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            t = time.perf_counter()
            with urllib.request.urlopen(self.url, timeout=60) as r:
                r.read()
            self.rtts.append(time.perf_counter() - t)
            self._halt.wait(self.every)

    def stop(self) -> list[float]:
        self._halt.set()
        self.join(60)
        return self.rtts
