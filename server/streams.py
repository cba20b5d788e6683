"""Which runs have an ingest connection, and which lost theirs without an End.

Plain asyncio (no FastAPI): the ingest route reports connects and disconnects; a run whose
last connection dropped is handed to ``on_lost`` unless one comes back within the grace
period.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class StreamTracker:
    """Counts ingest connections per run; calls ``on_lost(run)`` after a grace period.

    Args:
        grace: seconds a run may go without a connection before it counts as lost.
        on_lost: called on the event loop with the run id (marks it interrupted if it is
            still live).
    """

    def __init__(self, grace: float, on_lost: Callable[[str], None]):
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
