"""Settings for apps driven by Starlette's TestClient."""

from __future__ import annotations

from typing import Any

from gradwatch.server import Settings

TESTCLIENT_HOST = "testserver"
"""The Host every TestClient request and websocket handshake carries."""


def app_settings(**kw: Any) -> Settings:
    """Settings whose Host rule accepts TestClient's ``testserver`` (as ``--allow-host``)."""
    return Settings(allowed_hosts=(TESTCLIENT_HOST,), **kw)
