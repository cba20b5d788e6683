"""A dashboard-like live client in a thread (websockets sync client)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from websockets.sync.client import connect


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
            with connect(self.url, open_timeout=5) as ws:
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
