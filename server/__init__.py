"""gradwatch.server: the FastAPI service, SQLite storage and live fan-out (never torch).

``create_app(settings)`` builds the app; ``gradwatch serve`` runs it with uvicorn. The
app module is imported on first use so the plain core modules import without FastAPI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gradwatch.server.settings import Settings

if TYPE_CHECKING:
    from gradwatch.server.app import create_app as create_app

__all__ = ["Settings", "create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from gradwatch.server.app import create_app

        return create_app
    raise AttributeError(f"module 'gradwatch.server' has no attribute {name!r}")
