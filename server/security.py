"""Who may talk to the server: the Host, Origin, cross-site-write and token rules.

Every rule lives here once, as a plain function over header mappings (tested without a
server), and :class:`Guard`, a pure-ASGI middleware, applies them to every HTTP request and
websocket handshake, in this order:

1. **Host** (DNS rebinding): without a token, the ``Host`` header must name this server:
   ``localhost``, a loopback address, the address it is bound to (not a wildcard one) or a
   ``--allow-host`` name. A page on ``evil.example`` whose name resolves to 127.0.0.1
   reaches the port, but its requests say ``Host: evil.example``. With a token any name is
   allowed: such a page has no token (the cookie belongs to the real host name).
2. **Origin**: a websocket handshake with an Origin must come from the server's own origin
   or an ``--allow-origin``; so must any request that changes data (every method but GET,
   HEAD, OPTIONS). ``null`` is never allowed. A write without an Origin is allowed only
   where a browser cannot have sent it: with an ``X-Gradwatch`` header, or with a
   Content-Type a page can only send after a CORS preflight this server never answers
   (anything but none, text/plain, application/x-www-form-urlencoded and
   multipart/form-data; e.g. ``application/x-ndjson``).
3. **Token** (when configured): ``Authorization: Bearer``, the ``gradwatch-token-PORT``
   cookie or ``?token=``. Opening the dashboard with ``/?token=`` answers with a redirect
   that sets the cookie (HttpOnly, SameSite=Strict) and drops the token from the URL.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from gradwatch.frames import CloseCode
from gradwatch.server.settings import Settings

log = logging.getLogger(__name__)

PUBLIC_PATHS = ("/healthz",)
PUBLIC_PREFIXES = ("/static/",)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
WRITE_HEADER = "x-gradwatch"
"""A header that marks a write as not sent by a web page (a page cannot add it cross-site)."""
SIMPLE_TYPES = ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data")
"""The Content-Types a page can POST to another site without a CORS preflight."""


def host_name(value: str) -> str | None:
    """The name in a ``Host`` header, lower-case, without port, brackets or a final dot.

    ``None`` when the header is not a plain ``name[:port]``.
    """
    v = value.strip().lower()
    if not v or any(c in v for c in "/@?#\\ "):
        return None
    try:
        parts = urlsplit("//" + v)
        name, _ = parts.hostname, parts.port  # .port raises on a malformed port
    except ValueError:
        return None
    name = (name or "").rstrip(".")
    return name or None


def _is_loopback(name: str) -> bool:
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _bound_name(settings: Settings) -> str | None:
    """The bind address as a Host name, unless it is a wildcard (0.0.0.0, ::)."""
    name = settings.host.strip("[]").lower()
    try:
        if ipaddress.ip_address(name).is_unspecified:
            return None
    except ValueError:
        pass
    return name


def host_ok(settings: Settings, host: str | None) -> bool:
    """Whether a request's ``Host`` names this server (always true with a token)."""
    if settings.token or "*" in settings.allowed_hosts:
        return True
    if host is None:  # every browser sends Host: this is not a page
        return True
    name = host_name(host)
    if name is None:
        return False
    allowed = {"localhost", _bound_name(settings)}
    allowed.update(h.lower().rstrip(".") for h in settings.allowed_hosts)
    return name in allowed or _is_loopback(name)


def origin_ok(settings: Settings, headers: Mapping[str, str]) -> bool:
    """Whether a request's ``Origin`` (if any) is the server's own or an allowed one.

    Same origin: same ``host:port`` as the ``Host`` header, over http or https. ``null``
    (sandboxed frames, file:// pages, some redirects) is never the server's own.
    """
    origin = headers.get("origin")
    if origin is None:
        return True
    if origin in settings.allowed_origins:
        return True
    parts = urlsplit(origin)
    host = headers.get("host", "")
    return parts.scheme in ("http", "https") and bool(host) and parts.netloc == host


def write_refusal(settings: Settings, method: str, headers: Mapping[str, str]) -> str | None:
    """Why a request that may change data is refused as cross-site, or ``None``."""
    if method in SAFE_METHODS:
        return None
    origin = headers.get("origin")
    if origin is not None:
        if origin_ok(settings, headers):
            return None
        return (f"cross-site request refused: Origin {origin!r} is not this server's own; "
                f"start the server with --allow-origin ORIGIN to allow a page there")
    if headers.get(WRITE_HEADER) or method != "POST":
        return None  # browsers send Origin with every non-POST write
    ctype = headers.get("content-type", "").lower()
    if ctype.strip() and not any(t in ctype for t in SIMPLE_TYPES):
        return None
    return ("a POST without an Origin must carry the header 'X-Gradwatch: 1' or a "
            "non-form Content-Type (e.g. application/x-ndjson): a web page cannot send "
            "either to this server")


def cookie_name(host: str | None) -> str:
    """The token cookie of the server a browser reaches at ``host`` (cookies ignore ports,
    so two servers on one machine need two names)."""
    port = ""
    if host:
        try:
            port = str(urlsplit("//" + host.strip()).port or "")
        except ValueError:
            port = ""
    return f"gradwatch-token-{port or 'default'}"


def _cookies(headers: Mapping[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in headers.get("cookie", "").split(";"):
        k, sep, v = part.strip().partition("=")
        if sep:
            out.setdefault(k, unquote(v))
    return out


def given_token(headers: Mapping[str, str], query: Mapping[str, str]) -> str | None:
    """The token a request presents: bearer header, then cookie, then ``?token=``."""
    auth = headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    cookie = _cookies(headers).get(cookie_name(headers.get("host")))
    return cookie if cookie is not None else query.get("token")


def token_ok(settings: Settings, headers: Mapping[str, str],
             query: Mapping[str, str]) -> bool:
    """Whether a request carries the configured token (always true without one)."""
    if not settings.token:
        return True
    given = given_token(headers, query) or ""
    return hmac.compare_digest(given.encode(), settings.token.encode())


Scope = dict[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class Guard:
    """Applies the rules above to every request and handshake; see the module docstring.

    Refusals: HTTP 403 (Host, Origin) or 401 (token) with ``{"detail": sentence}``; a
    websocket handshake gets the same status and body (close 1008 before accept where the
    server cannot send an HTTP response to a handshake).
    """

    def __init__(self, app: ASGIApp, settings: Settings):
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", [])}
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        path = scope.get("path", "")
        status, detail = self._check(kind, scope.get("method", "GET"), path, headers, query)
        if status == 303:
            await _redirect_with_cookie(send, path, query, headers, self.settings)
        elif status:
            if status == 403:
                log.warning("refused %s %s: %s", "websocket" if kind == "websocket"
                            else scope.get("method"), path, detail)
            await _refuse(scope, send, status, detail)
        else:
            await self.app(scope, receive, send)

    def _check(self, kind: str, method: str, path: str, headers: Mapping[str, str],
               query: Mapping[str, str]) -> tuple[int, str]:
        s = self.settings
        host = headers.get("host")
        if not host_ok(s, host):
            return 403, (f"Host {host!r} is not allowed: without a token this server answers "
                         f"only to localhost and loopback addresses (a guard against DNS "
                         f"rebinding); start it with --allow-host NAME to allow a name")
        if kind == "websocket" and not origin_ok(s, headers):
            return 403, (f"Origin {headers.get('origin')!r} is not allowed on this socket; "
                         f"start the server with --allow-origin ORIGIN to allow a page there")
        refusal = write_refusal(s, method, headers) if kind == "http" else None
        if refusal:
            return 403, refusal
        if not s.token or (kind == "http" and (path in PUBLIC_PATHS
                                               or path.startswith(PUBLIC_PREFIXES))):
            return 0, ""
        if not token_ok(s, headers, query):
            return 401, ("this server requires a token: send 'Authorization: Bearer TOKEN', "
                         "or open the dashboard once as /?token=TOKEN")
        if kind == "http" and path == "/" and method == "GET" and "token" in query:
            return 303, ""
        return 0, ""


async def _refuse(scope: Scope, send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
    elif "websocket.http.response" in scope.get("extensions", {}):
        await send({"type": "websocket.http.response.start", "status": status,
                    "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body})
    else:
        await send({"type": "websocket.close", "code": CloseCode.POLICY,
                    "reason": detail[:120]})


async def _redirect_with_cookie(send: Send, path: str, query: Mapping[str, str],
                                headers: Mapping[str, str], settings: Settings) -> None:
    """Answer ``/?token=T`` with the token as a cookie and the same URL without it."""
    rest = urlencode([(k, v) for k, v in query.items() if k != "token"])
    where = path + (f"?{rest}" if rest else "")
    cookie = (f"{cookie_name(headers.get('host'))}={quote(settings.token or '', safe='')}; "
              f"Path=/; HttpOnly; SameSite=Strict")
    await send({"type": "http.response.start", "status": 303, "headers": [
        (b"location", where.encode("latin-1")), (b"set-cookie", cookie.encode("latin-1")),
        (b"cache-control", b"no-store"), (b"content-length", b"0")]})
    await send({"type": "http.response.body", "body": b""})
