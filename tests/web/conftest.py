"""Fixtures for the dashboard tests: a real server process and a real Chromium.

The server is ``gradwatch serve`` in a subprocess on a free loopback port with a
temporary data directory; the browser is Debian's Chromium driven by async Playwright,
launched once per worker (per set of extra flags) on one event loop shared by the
dashboard tests; each test gets a fresh context (no cookies, storage or cache shared).
Every test leaves a screenshot of the page in ``test-artifacts/`` (also when it fails).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from pytest_asyncio import is_async_test

from tests.serverproc import ServerProc

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = os.environ.get("GRADWATCH_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
]

pytestmark = pytest.mark.browser
HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # One event loop per worker for these tests, so that one Chromium serves them all
    # (a launch costs seconds; about thirty tests launched one each).
    session_loop = pytest.mark.asyncio(loop_scope="session")
    for item in items:
        if is_async_test(item) and HERE in Path(item.path).resolve().parents:
            item.add_marker(session_loop, append=False)


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


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def browsers() -> AsyncIterator[Callable[[tuple[str, ...]], Awaitable[Any]]]:
    """A Chromium for a set of extra flags, launched on first use and kept for the worker."""
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        launched: dict[tuple[str, ...], Any] = {}

        async def browser(extra: tuple[str, ...]) -> Any:
            if extra not in launched or not launched[extra].is_connected():
                launched[extra] = await pw.chromium.launch(
                    executable_path=CHROMIUM, args=CHROMIUM_ARGS + list(extra))
            return launched[extra]

        try:
            yield browser
        finally:
            for b in launched.values():
                with contextlib.suppress(Exception):
                    await b.close()


@pytest_asyncio.fixture(loop_scope="session")
async def page(
    request: pytest.FixtureRequest,
    browsers: Callable[[tuple[str, ...]], Awaitable[Any]],
) -> AsyncIterator[Page]:
    if not shutil.which(CHROMIUM):
        pytest.skip(f"Chromium not found at {CHROMIUM} (apt-get install chromium)")
    ARTIFACTS.mkdir(exist_ok=True)
    marker = request.node.get_closest_marker("chromium_args")
    browser = await browsers(tuple(marker.args) if marker else ())
    context = await browser.new_context(viewport={"width": 1400, "height": 1000})
    # A guard against hangs, not a speed check: a worker's first page (a cold Chromium
    # parsing plotly) at the start of the suite, beside the heaviest tests, took over
    # Playwright's default 30 s once.
    context.set_default_timeout(90_000)
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
        await context.close()
