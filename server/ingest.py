"""Ingest frame checks: size, rate, parsing, and which streams are connected.

Plain module (no FastAPI): the websocket route calls these and turns a
:class:`FrameError` into a close code and reason.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import Field, TypeAdapter, ValidationError

from gradwatch.frames import Hello
from gradwatch.wire import IngestBatch

log = logging.getLogger(__name__)

CLOSE_UNSUPPORTED = 1003
CLOSE_INVALID = 1007
CLOSE_POLICY = 1008
CLOSE_TOO_BIG = 1009
CLOSE_TRY_LATER = 1013
CLOSE_NO_RUN = 4404

_FRAME: TypeAdapter[Any] = TypeAdapter(
    Annotated[Hello | IngestBatch, Field(discriminator="type")])


class FrameError(Exception):
    """A frame that closes its connection; ``code`` and ``reason`` go in the close."""

    def __init__(self, code: int, reason: str):
        super().__init__(reason)
        self.code = code
        self.reason = short(reason)


def short(reason: str, limit: int = 123) -> str:
    """A close reason cut to the 123 bytes a websocket close frame can carry."""
    b = reason.encode()
    if len(b) <= limit:
        return reason
    return b[:limit - 3].decode(errors="ignore") + "..."


def check_size(text: str, max_bytes: int) -> None:
    """Raise :class:`FrameError` (1009) for a frame over ``max_bytes`` of UTF-8."""
    n = len(text)
    if n > max_bytes or (n * 4 > max_bytes and len(text.encode()) > max_bytes):
        raise FrameError(CLOSE_TOO_BIG, f"frame too big: the limit is {max_bytes} bytes; "
                                        f"send smaller batches")


def parse_frame(text: str) -> Hello | IngestBatch:
    """Validate one ingest frame against the wire contract.

    Raises:
        FrameError: 1003 when it is not JSON, 1007 when it is not a valid frame (the
            reason names the first wrong field).
    """
    try:
        frame: Hello | IngestBatch = _FRAME.validate_json(text)
        return frame
    except ValidationError as e:
        err = e.errors()[0]
        if err.get("type") == "json_invalid":
            raise FrameError(CLOSE_UNSUPPORTED, "frame is not JSON; send IngestBatch JSON "
                                                "text frames") from None
        loc = ".".join(str(x) for x in err.get("loc", ()))
        raise FrameError(CLOSE_INVALID, f"invalid frame at {loc or 'top level'}: "
                                        f"{err.get('msg', 'invalid')}") from None


class RateLimiter:
    """Token bucket: ``rate`` frames per second sustained, bursts of ``2 * rate``."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic):
        self.rate = rate
        self.capacity = max(1.0, 2 * rate)
        self._tokens = self.capacity
        self._clock = clock
        self._last = clock()

    def allow(self) -> bool:
        """Take a token for one frame; ``False`` when over the rate."""
        now = self._clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._last) * self.rate)
        self._last = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        return False


class StreamTracker:
    """Counts ingest connections per run; calls ``on_lost(run)`` after a grace period.

    A run whose last connection dropped (without End) and did not come back within
    ``grace`` seconds is handed to ``on_lost``, which marks it interrupted if it is
    still live.
    """

    def __init__(self, grace: float, on_lost: Callable[[str], Any]):
        self.grace = grace
        self.on_lost = on_lost
        self._active: dict[str, int] = {}

    def connect(self, run: str) -> None:
        """An ingest connection started sending to ``run``."""
        self._active[run] = self._active.get(run, 0) + 1

    def disconnect(self, run: str) -> None:
        """An ingest connection of ``run`` closed."""
        n = self._active.get(run, 0) - 1
        if n > 0:
            self._active[run] = n
            return
        self._active.pop(run, None)
        asyncio.get_running_loop().call_later(self.grace, self._check, run)

    def active(self, run: str) -> bool:
        """Whether an ingest connection is sending to ``run``."""
        return self._active.get(run, 0) > 0

    def _check(self, run: str) -> None:
        if not self.active(run):
            self.on_lost(run)
