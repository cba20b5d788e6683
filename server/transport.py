"""How ``gradwatch serve`` runs uvicorn: connection limits and logs that hold no token.

uvicorn gives no deadline for a request's headers and (with httptools) no limit on their
size, so a client that sends a request line and then trickles headers, or none, keeps a
connection forever; :func:`http_protocol` adds both to uvicorn's HTTP protocol class (h11,
uvicorn's other parser, has a head limit of its own, ``h11_max_incomplete_event_size``,
used when httptools is missing; httptools and llhttp have none, and h11 parses bodies in
Python, slower for large imports). The limit counts the head only: the bytes up to the
blank line that ends it, however much body arrives in the same read. A
websocket closed by the app, or by an unanswered ping, while its peer reads nothing keeps
its socket and unsent buffer forever (asyncio closes a transport only once its buffer
drained) and the app never hears it went; :func:`ws_protocol` aborts it instead.
:class:`TokenMask` rewrites ``token=...`` in uvicorn's access and websocket log lines.
Only :mod:`server.cli` imports this module.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Any

from gradwatch.server.settings import Settings

_TOKEN = re.compile(r"(?i)((?:^|[?&;])token=)[^&\s\"']*")


class TokenMask(logging.Filter):
    """Masks the value of a ``token=`` query parameter in a log record's arguments."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(_TOKEN.sub(r"\1***", a) if isinstance(a, str) else a
                                for a in record.args)
        elif isinstance(record.msg, str):
            record.msg = _TOKEN.sub(r"\1***", record.msg)
        return True


def mask_tokens_in_logs() -> None:
    """Install :class:`TokenMask` on uvicorn's loggers (once)."""
    for name in ("uvicorn.access", "uvicorn.error"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, TokenMask) for f in logger.filters):
            logger.addFilter(TokenMask())


def _status(code: int, phrase: str, detail: str) -> bytes:
    body = json.dumps({"detail": detail}).encode()
    return (f"HTTP/1.1 {code} {phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode() + body


def head_end(data: bytes) -> int:
    """Index just past the blank line ending a request head in ``data``; -1: not in it.

    llhttp accepts bare LF line ends as well as CRLF, so either blank line ends a head.
    """
    ends = [i + len(m) for m in (b"\r\n\r\n", b"\n\n") if (i := data.find(m)) >= 0]
    return min(ends) if ends else -1


def http_protocol(settings: Settings) -> Any:
    """uvicorn's httptools protocol with a header deadline and a head-size limit.

    Returns ``"h11"`` (whose head-size limit uvicorn exposes; it has no deadline) when
    httptools is not installed.
    """
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # pragma: no cover - uvicorn without [standard]
        return "h11"

    timeout, limit = settings.header_timeout, settings.max_header_bytes

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        """Closes a connection whose request head is late (408) or too big (431)."""

        _head_timer: asyncio.TimerHandle | None = None
        _head_bytes = 0
        _head_tail = b""
        """The last bytes of the head so far: a blank line may span two reads."""

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def _arm(self) -> None:
            if self._head_timer is None:
                self._head_bytes, self._head_tail = 0, b""
                self._head_timer = self.loop.call_later(timeout, self._head_late)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_late(self) -> None:
            self._head_timer = None
            self._refuse(408, "Request Timeout",
                         f"request headers not received within {timeout:g} s")

        def _refuse(self, code: int, phrase: str, detail: str) -> None:
            if not self.transport.is_closing():
                self.transport.write(_status(code, phrase, detail))
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self._head_timer is not None:
                self._count_head(data)
                if self._head_bytes > limit:
                    self._disarm()
                    self._refuse(431, "Request Header Fields Too Large",
                                 f"request head over {limit} bytes")
                    return
            super().data_received(data)

        def _count_head(self, data: bytes) -> None:
            # Only the bytes up to the head's end count: a client writing head and body
            # at once (urllib, a single sendall, curl under load) hands both in one read.
            seen = self._head_tail + data
            end = head_end(seen)
            if end < 0:
                self._head_bytes += len(data)
                self._head_tail = seen[-3:]
            else:
                self._head_bytes += end - len(self._head_tail)
                self._head_tail = b""

        def on_message_begin(self) -> None:  # the next request of a kept-alive connection
            super().on_message_begin()
            self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return GuardedHttpToolsProtocol


ABORT_AFTER = 5.0
"""Seconds a websocket the app has finished with may take to close before it is aborted."""


def ws_protocol() -> Any:
    """uvicorn's websocket protocol, aborting a finished connection that does not close.

    Returns ``"auto"`` when uvicorn's websockets-sansio implementation is not available.
    """
    try:
        from uvicorn.protocols.websockets.websockets_sansio_impl import (
            WebSocketsSansIOProtocol,
        )
    except ImportError:  # pragma: no cover - without the websockets package
        return "auto"

    class AbortingWebSocketProtocol(WebSocketsSansIOProtocol):
        """Aborts the socket if it has not closed a moment after the app finished, or
        after a ping went unanswered (then the app hears of it: a client that reads
        nothing, with nothing more to send it, is dropped too)."""

        async def run_asgi(self) -> None:
            try:
                await super().run_asgi()
            finally:
                self.loop.call_later(ABORT_AFTER, self._abort_if_open)

        def keepalive_timeout(self) -> None:
            super().keepalive_timeout()
            self.loop.call_later(ABORT_AFTER, self._abort_if_open)

        def _abort_if_open(self) -> None:
            if not self.disconnected:  # the peer never read our close: drop it, buffer too
                self.transport.abort()

    return AbortingWebSocketProtocol


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """Keyword arguments of ``uvicorn.run`` that carry the settings' transport limits."""
    return {
        "http": http_protocol(settings),
        "ws": ws_protocol(),
        "h11_max_incomplete_event_size": settings.max_header_bytes,
        "timeout_keep_alive": max(1, round(settings.keep_alive_timeout)),
        "ws_max_size": settings.max_frame_bytes * 4 + 4096,
        "ws_ping_interval": settings.ping_interval,
        "ws_ping_timeout": settings.ping_timeout,
    }
