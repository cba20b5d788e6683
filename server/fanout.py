"""Live fan-out: one bounded queue per dashboard client; a slow client never stalls others.

Ingest publishes each stored batch once; the frame is serialised once (from the stored
rows, not validated again) and the same text is queued for every client watching that run.
A client whose queue fills up gets its queued step frames merged and downsampled by the
rule of :mod:`server.downsampling` into one frame marked ``decimated`` (and only the latest
run/findings frame kept); the route drops a client whose socket stays blocked. Run-list
updates are rate-limited per run (trailing edge: the last state always arrives). Plain
asyncio; no FastAPI.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Literal

from gradwatch.frames import (
    DeletedFrame,
    FindingsFrame,
    OptimizerFrame,
    OptimizerView,
    RunFrame,
    RunSummary,
    StepsFrame,
    frame_json,
)
from gradwatch.server.downsampling import downsample
from gradwatch.server.rows import Row, SeriesRows
from gradwatch.wire import Finding

log = logging.getLogger(__name__)


@dataclass
class Item:
    """One queued frame: its text, plus its rows for a steps frame (to merge them)."""

    kind: Literal["steps", "findings", "optimizer", "run", "deleted"]
    text: str
    rows: list[Row] | None = None


class Client:
    """A live client's bounded queue. ``run`` is ``None`` for the run-list view."""

    def __init__(self, run: str | None, max_items: int = 256, max_rows: int = 4000):
        self.run = run
        self.max_items = max_items
        self.max_rows = max_rows
        self.decimated = 0
        self.skip_until: dict[tuple[int, str], int] | None = None
        """Per (rank, opt), the last step the snapshot already held."""
        self._items: deque[Item] = deque()
        self._event = asyncio.Event()

    def offer(self, item: Item) -> None:
        """Queue a frame; never blocks, never grows past ``max_items``."""
        if len(self._items) >= self.max_items:
            self._collapse()
        self._items.append(item)
        self._event.set()

    def _collapse(self) -> None:
        rows: list[Row] = []
        keep: list[Item] = []
        last: dict[str, Item] = {}
        for it in self._items:
            if it.rows is not None:
                rows.extend(it.rows)
            elif it.kind in ("run", "findings"):
                last[it.kind] = it
            else:
                keep.append(it)
        self._items.clear()
        self._items.extend(keep)
        if rows and self.run is not None:
            small, bucket = downsample(rows, self.max_rows)
            self._items.append(_steps_item(self.run, small, decimated=True, bucket=bucket,
                                           total=len(rows)))
        self._items.extend(last.values())
        self.decimated += 1
        while len(self._items) >= self.max_items:  # only if flooded with other frames
            self._items.popleft()

    def pending(self) -> int:
        """Frames queued and not yet taken."""
        return len(self._items)

    async def next(self) -> list[str]:
        """Wait for frames, then take every queued one (texts, oldest first)."""
        await self._event.wait()
        self._event.clear()
        items = list(self._items)
        self._items.clear()
        if self.skip_until is not None:
            items = self._skip_old(items)
        return [it.text for it in items]

    def _skip_old(self, items: list[Item]) -> list[Item]:
        """Drop step rows a snapshot already sent (a batch stored just before it)."""
        skip = self.skip_until or {}
        out: list[Item] = []
        for it in items:
            if it.rows is not None and self.run is not None:
                rows = [r for r in it.rows if r.step > skip.get((r.rank, r.opt), -1)]
                if len(rows) == len(it.rows):
                    self.skip_until = None  # from here on everything is new
                elif not rows:
                    continue
                else:
                    it = _steps_item(self.run, rows, decimated=False)
            out.append(it)
        return out


def _steps_item(run: str, rows: list[Row], decimated: bool, bucket: int = 1,
                total: int | None = None) -> Item:
    rows = sorted(rows, key=lambda r: (r.rank, r.opt, r.step))
    series = SeriesRows(rows, bucket, decimated, len(rows) if total is None else total
                        ).columns()
    return Item("steps", frame_json(StepsFrame, run=run, steps=series, decimated=decimated),
                rows)


class Hub:
    """Who watches what, and the per-run rate limit on run summaries."""

    def __init__(self, summary_interval: float = 0.25, max_clients: int = 200,
                 max_items: int = 256, max_rows: int = 4000):
        self.summary_interval = summary_interval
        self.max_clients = max_clients
        self.max_items = max_items
        self.max_rows = max_rows
        self._clients: set[Client] = set()
        self._last_sent: dict[str, float] = {}
        self._pending: dict[str, RunSummary] = {}

    def subscribe(self, run: str | None) -> Client | None:
        """A new client queue, or ``None`` when the client limit is reached."""
        if len(self._clients) >= self.max_clients:
            return None
        c = Client(run, self.max_items, self.max_rows)
        self._clients.add(c)
        return c

    def unsubscribe(self, client: Client) -> None:
        """Forget a client (it left)."""
        self._clients.discard(client)

    def clients(self) -> int:
        """Number of live clients."""
        return len(self._clients)

    def _offer(self, run: str | None, item: Item, list_too: bool = False) -> None:
        for c in list(self._clients):
            if c.run == run or (list_too and c.run is None):
                c.offer(item)

    def _watched(self, run: str) -> bool:
        return any(c.run == run for c in self._clients)

    def publish_steps(self, run: str, rows: list[Row]) -> None:
        """New step rows of a run (already stored)."""
        if rows and self._watched(run):
            self._offer(run, _steps_item(run, rows, decimated=False))

    def publish_findings(self, run: str, findings: list[Finding]) -> None:
        """A run's findings changed (the full list)."""
        if self._watched(run):
            text = FindingsFrame(run=run, findings=findings).model_dump_json()
            self._offer(run, Item("findings", text))

    def publish_optimizer(self, run: str, view: OptimizerView) -> None:
        """An optimizer appeared in a run."""
        if self._watched(run):
            text = OptimizerFrame(run=run, optimizer=view).model_dump_json()
            self._offer(run, Item("optimizer", text))

    def publish_deleted(self, run: str) -> None:
        """A run was deleted."""
        self._offer(run, Item("deleted", DeletedFrame(run=run).model_dump_json()), True)

    def publish_summary(self, summary: RunSummary, now: float | None = None) -> None:
        """A run changed: tell its watchers and the run lists, ≤ 1 per interval per run."""
        now = time.monotonic() if now is None else now
        run = summary.id
        wait = self._last_sent.get(run, -1e9) + self.summary_interval - now
        if wait <= 0:
            self._send_summary(summary, now)
            return
        first = run not in self._pending
        self._pending[run] = summary
        if first:
            asyncio.get_running_loop().call_later(wait, self._flush, run)

    def _flush(self, run: str) -> None:
        summary = self._pending.pop(run, None)
        if summary is not None:
            self._send_summary(summary, time.monotonic())

    def _send_summary(self, summary: RunSummary, now: float) -> None:
        self._last_sent[summary.id] = now
        if len(self._last_sent) > 10_000:  # forget the oldest runs' timestamps
            for k in list(self._last_sent)[:5000]:
                del self._last_sent[k]
        self._offer(summary.id, Item("run", RunFrame(run=summary).model_dump_json()), True)
