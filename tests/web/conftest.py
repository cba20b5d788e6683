"""Fixtures for the dashboard tests: a real server process and a real Chromium.

The server is ``gradwatch serve`` in a subprocess on a free loopback port with a
temporary data directory; the browser is Debian's Chromium driven by async Playwright.
Every test leaves a screenshot of the page in ``test-artifacts/`` (also when it fails).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = os.environ.get("GRADWATCH_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
]

pytestmark = pytest.mark.browser


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """``gradwatch serve`` as a child process that a test can stop and start again."""

    def __init__(self, data: Path, port: int, log: Path, extra: tuple[str, ...] = ()):
        self.extra = extra
        self.data = data
        self.port = port
        self.log_path = log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        cmd = [sys.executable, "-m", "gradwatch.cli", "serve", "--host", "127.0.0.1",
               "--port", str(self.port), "--data", str(self.data), *self.extra]
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited ({self.proc.returncode}):\n{self.log()}")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"server not healthy within {timeout} s:\n{self.log()}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path / "data", free_port(), tmp_path / "server.log")
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


class Page:
    """A Playwright page plus what the test must check afterwards (errors, dialogs)."""

    def __init__(self, page: Any):
        self.page = page
        self.errors: list[str] = []
        self.dialogs: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.page, name)


@pytest.fixture
async def page(request: pytest.FixtureRequest) -> AsyncIterator[Page]:
    if not shutil.which(CHROMIUM):
        pytest.skip(f"Chromium not found at {CHROMIUM} (apt-get install chromium)")
    from playwright.async_api import async_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = await browser.new_context(viewport={"width": 1400, "height": 1000})
        raw = await context.new_page()
        wrapped = Page(raw)
        raw.on("pageerror", lambda e: wrapped.errors.append(str(e)))

        def on_dialog(dialog: Any) -> None:
            wrapped.dialogs.append(f"{dialog.type}: {dialog.message}")
            asyncio.ensure_future(dialog.dismiss())

        raw.on("dialog", on_dialog)
        try:
            yield wrapped
        finally:
            with contextlib.suppress(Exception):
                await raw.screenshot(path=str(ARTIFACTS / f"web-{request.node.name}.png"),
                                     full_page=True)
            await browser.close()
