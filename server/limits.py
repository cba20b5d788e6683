"""Limits on ingest: frame size, frame rate per client address, open connections.

Plain module (no FastAPI): the ingest route applies these to every connection and frame
and turns what they raise into a close code.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from gradwatch.server.errors import FrameTooBig, TooManyConnections, TooManyFrames

T = TypeVar("T")


async def within(aw: Awaitable[T], timeout: float) -> T:
    """``await aw``, or raise :class:`TimeoutError` (asyncio's) after ``timeout`` seconds."""
    if sys.version_info >= (3, 11):  # a timer, not a task per call as wait_for makes
        async with asyncio.timeout(timeout):
            return await aw
    return await asyncio.wait_for(aw, timeout)  # pragma: no cover - Python 3.10


def check_size(text: str, max_bytes: int) -> None:
    """Refuse a frame over ``max_bytes`` of UTF-8.

    Raises:
        FrameTooBig: it is longer.
    """
    n = len(text)
    # A str of n characters holds at most 4n bytes of UTF-8: encode only when it may matter.
    if n > max_bytes or (n * 4 > max_bytes and len(text.encode()) > max_bytes):
        raise FrameTooBig(f"frame too big: the limit is {max_bytes} bytes; send smaller "
                          f"batches")


class RateLimiter:
    """Token bucket: ``rate`` frames per second sustained, bursts of ``2 * rate``."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic):
        self.rate = rate
        self.capacity = max(1.0, 2 * rate)
        self._tokens = self.capacity
        self._clock = clock
        self._last = clock()

    def take(self) -> None:
        """Take a token for one frame.

        Raises:
            TooManyFrames: the connection is over its rate.
        """
        now = self._clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._last) * self.rate)
        self._last = now
        if self._tokens < 1:
            raise TooManyFrames(f"rate limit: more than {self.rate:g} frames/s from this "
                                f"address")
        self._tokens -= 1

    def full(self) -> bool:
        """Whether the bucket has refilled (the client has been quiet long enough)."""
        return self._tokens + (self._clock() - self._last) * self.rate >= self.capacity


class IngestGate:
    """Ingest connections: how many may be open, and one frame-rate budget per address.

    The rate limit is per client address, shared by all its connections, so opening more
    connections does not buy more frames. A quarter of the connections (at least one) is
    kept for streams that are owned: once the rest are taken, a new connection is admitted
    only *on trial*, and stays only if its first hello proves it holds the key of a stream
    the server already keeps (:meth:`Runs.owns`). Locally every client shares one address,
    so this, with the deadline for a first frame, is what keeps a client holding idle
    sockets from locking every probe out.

    Args:
        max_connections: open ingest connections allowed at once.
        rate: frames per second per client address (see :class:`RateLimiter`).
    """

    _FORGET_AFTER = 1024
    """Addresses remembered before idle ones (no connection, bucket refilled) are forgotten."""

    def __init__(self, max_connections: int, rate: float,
                 clock: Callable[[], float] = time.monotonic):
        self.max_connections = max_connections
        self.reserved = max(1, max_connections // 4) if max_connections > 1 else 0
        """Connections kept for streams that are owned."""
        self.rate = rate
        self._clock = clock
        self._open: dict[str, int] = {}
        self._on_trial = 0
        self._buckets: dict[str, RateLimiter] = {}

    def open(self, address: str) -> tuple[RateLimiter, bool]:
        """Admit a connection from ``address``: the address's shared rate limiter, and
        whether the connection is on trial (it must prove a stream it owns, then
        :meth:`proven`; else it is closed and :meth:`close` called with ``trial=True``).

        Raises:
            TooManyConnections: ``max_connections`` are already open.
        """
        total = sum(self._open.values())
        if total >= self.max_connections:
            raise TooManyConnections(f"too many ingest connections (the limit is "
                                     f"{self.max_connections}); retry later")
        trial = total - self._on_trial >= self.max_connections - self.reserved
        self._open[address] = self._open.get(address, 0) + 1
        self._on_trial += trial
        bucket = self._buckets.get(address)
        if bucket is None:
            if len(self._buckets) >= self._FORGET_AFTER:
                self._forget_idle()
            bucket = self._buckets[address] = RateLimiter(self.rate, self._clock)
        return bucket, trial

    def refuse_trial(self) -> TooManyConnections:
        """The refusal of a connection on trial that did not prove a stream it owns."""
        return TooManyConnections(
            f"too many ingest connections: the rest ({self.reserved}) are kept for streams "
            f"the server already keeps; retry later")

    def proven(self) -> None:
        """A connection on trial proved a stream it owns: it stays, no longer on trial."""
        self._on_trial -= 1

    def close(self, address: str, trial: bool = False) -> None:
        """A connection admitted by :meth:`open` closed (``trial``: still on trial)."""
        self._on_trial -= trial
        n = self._open.get(address, 0) - 1
        if n > 0:
            self._open[address] = n
        else:
            self._open.pop(address, None)

    def _forget_idle(self) -> None:
        # A bucket that has refilled holds no state a new one would not: forget it.
        for addr, bucket in list(self._buckets.items()):
            if addr not in self._open and bucket.full():
                del self._buckets[addr]
