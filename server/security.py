"""Token and Origin checks, shared by the HTTP middleware and the websocket routes.

Plain functions over header/query mappings plus a pure-ASGI middleware, so they can be
tested without a server.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import parse_qs, urlsplit

from gradwatch.server.settings import Settings

PUBLIC_PATHS = ("/healthz",)
PUBLIC_PREFIXES = ("/static/",)


def token_ok(settings: Settings, headers: Mapping[str, str],
             query: Mapping[str, str]) -> bool:
    """Whether a request carries the configured token (always true without one)."""
    if not settings.token:
        return True
    auth = headers.get("authorization", "")
    given = auth[7:].strip() if auth.lower().startswith("bearer ") else query.get("token", "")
    return hmac.compare_digest(given.encode(), settings.token.encode())


def origin_ok(settings: Settings, headers: Mapping[str, str]) -> bool:
    """Whether a websocket handshake may proceed, judging by its ``Origin``.

    Non-browser clients send no Origin and are allowed; a browser page is allowed only
    from the server's own origin (same host:port as the ``Host`` header) or an origin
    listed in ``settings.allowed_origins``. This stops another site's page from opening
    the sockets (cross-site websocket hijacking).
    """
    origin = headers.get("origin")
    if origin is None:
        return True
    if origin in settings.allowed_origins:
        return True
    parts = urlsplit(origin)
    host = headers.get("host", "")
    return parts.scheme in ("http", "https") and bool(host) and parts.netloc == host


ASGIApp = Callable[[dict[str, Any], Callable[[], Awaitable[Any]],
                    Callable[[Any], Awaitable[None]]], Awaitable[None]]


class TokenMiddleware:
    """Refuses HTTP requests without the token (401) when one is configured.

    Websockets are checked by their routes, which must close with 1008 instead.
    """

    def __init__(self, app: ASGIApp, settings: Settings):
        self.app = app
        self.settings = settings

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Awaitable[Any]],
                       send: Callable[[Any], Awaitable[None]]) -> None:
        if scope["type"] != "http" or not self.settings.token:
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        if path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        query = {k: v[0] for k, v in
                 parse_qs(scope.get("query_string", b"").decode("latin-1")).items()}
        if token_ok(self.settings, headers, query):
            await self.app(scope, receive, send)
            return
        body = json.dumps({"detail": "this server requires a token: send "
                                     "'Authorization: Bearer TOKEN' or ?token=TOKEN"}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"),
                                (b"www-authenticate", b"Bearer"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
