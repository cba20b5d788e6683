"""Limits on one ingest connection: frame size and frame rate.

Plain module (no FastAPI): the ingest route applies these to every frame it reads and
turns what they raise into a close code.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gradwatch.server.errors import FrameTooBig, TooManyFrames


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
            raise TooManyFrames(f"rate limit: more than {self.rate:g} frames/s")
        self._tokens -= 1
