"""The dashboard's files: ``/`` (index.html), ``/static/...`` (web/) and plotly.js.

Files are served only from the installed ``gradwatch.web`` package; no request chooses a
path outside it. plotly.js is the pinned partial bundle vendored in ``web/vendor/`` (see
``scripts/refresh-plotly.sh``): no CDN, so the dashboard works offline.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

from fastapi import APIRouter, FastAPI, HTTPException
from fastapi.responses import FileResponse, HTMLResponse
from fastapi.staticfiles import StaticFiles

router = APIRouter(include_in_schema=False)

_PLACEHOLDER = ("<!doctype html><title>gradwatch</title><p>The gradwatch server is running, "
                "but the dashboard files (web/index.html) are not installed.</p>")


def web_dir() -> Path:
    """Directory of the installed ``gradwatch.web`` package."""
    return Path(str(importlib.resources.files("gradwatch.web")))


def plotly_js() -> Path:
    """The vendored plotly.js bundle (``web/vendor/plotly.min.js``) of the installed package."""
    return web_dir() / "vendor" / "plotly.min.js"


@router.get("/", response_model=None)
async def index() -> FileResponse | HTMLResponse:
    """The dashboard page."""
    page = web_dir() / "index.html"
    if page.is_file():
        return FileResponse(page, media_type="text/html")
    return HTMLResponse(_PLACEHOLDER)


@router.get("/static/vendor/plotly.min.js", response_model=None)
async def plotly() -> FileResponse:
    """The vendored plotly.js bundle (no CDN)."""
    p = plotly_js()
    if not p.is_file():
        raise HTTPException(404, "plotly.js is missing from this gradwatch install "
                                 "(gradwatch/web/vendor/plotly.min.js): reinstall gradwatch")
    # Cached for a day (revalidated by ETag after that): a returning browser skips the
    # download and reuses V8's compiled code, which is most of plotly's start-up.
    return FileResponse(p, media_type="text/javascript",
                        headers={"Cache-Control": "public, max-age=86400"})


def mount(app: FastAPI) -> None:
    """Add the dashboard routes and the ``/static`` mount to ``app``."""
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=web_dir(), check_dir=False), name="static")
