"""The app factory: ``create_app(settings)`` builds the FastAPI app; state on app.state."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError, WebSocketRequestValidationError

from gradwatch import __version__
from gradwatch.server import api, web, ws
from gradwatch.server.errors import Refused
from gradwatch.server.runs import Runs
from gradwatch.server.security import Guard
from gradwatch.server.settings import Settings

log = logging.getLogger(__name__)


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the gradwatch server app.

    The database opens when the app starts (lifespan) and closes when it stops, so
    ``with TestClient(create_app(s))`` and uvicorn both get a working, clean app.
    """
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runs = Runs(settings)
        runs.start()
        app.state.runs = runs
        log.info("gradwatch server: data in %s", runs.store.database.where)
        try:
            yield
        finally:
            runs.close()

    app = FastAPI(title="gradwatch", version=__version__, lifespan=lifespan,
                  description="Live gradient-reset debugger: ingest, runs, steps, findings.")
    app.state.settings = settings

    @app.get("/healthz", summary="Liveness probe (no token needed)")
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "version": __version__}

    app.include_router(api.router)
    app.add_exception_handler(Refused, api.refused)
    app.add_exception_handler(RequestValidationError, api.invalid_request)
    app.add_exception_handler(WebSocketRequestValidationError, ws.invalid_handshake)
    app.include_router(ws.router)
    web.mount(app)
    app.add_middleware(Guard, settings=settings)
    return app
