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
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.serverproc import ServerProc

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = os.environ.get("GRADWATCH_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
]

pytestmark = pytest.mark.browser


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProc]:
    srv = ServerProc(tmp_path / "data")
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
        marker = request.node.get_closest_marker("chromium_args")
        extra = list(marker.args) if marker else []
        browser = await pw.chromium.launch(executable_path=CHROMIUM,
                                           args=CHROMIUM_ARGS + extra)
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
