"""Live fan-out: one bounded queue per dashboard client; a slow client never stalls others.

Ingest publishes each stored batch once; the frame is serialised once (from the stored
rows, not validated again) and the same text is queued for every client watching that run.
Past a full queue, a client's step rows are set aside and merged and downsampled by the
rule of :mod:`server.downsampling` into one frame marked ``decimated`` when the client next
reads (only the latest run/findings frame of each run kept); a client too far behind, or
whose socket stays blocked (the route's send deadline), is dropped. Run-list updates are
rate-limited per run (trailing edge: the last state always arrives). Plain asyncio; no
FastAPI.
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
    ScalarsFrame,
    StepsFrame,
    frame_json,
)
from gradwatch.server.downsampling import downsample
from gradwatch.server.modelnorms import Norms
from gradwatch.server.rows import Row, Scalar, SeriesRows
from gradwatch.wire import Finding

log = logging.getLogger(__name__)


@dataclass
class Item:
    """One queued frame: its text, plus its rows for a steps frame (to merge them)."""

    kind: Literal["steps", "findings", "optimizer", "run", "deleted", "scalars"]
    text: str
    rows: list[Row] | None = None
    key: str = ""
    """Which run a ``run`` frame is about (a newer one of the same run replaces it)."""


class Client:
    """A live client's bounded queue. ``run`` is ``None`` for the run-list view.

    :meth:`offer` runs on the publisher's turn of the event loop for every client, so it
    does O(1) work and never serialises or downsamples. Past ``max_items`` frames, step
    rows are set aside (shared, not copied) and merged into one ``decimated`` frame by the
    client's own :meth:`next`, off the event loop; a client more than ``max_backlog`` rows
    behind is marked :attr:`too_slow` and its route drops it.
    """

    MERGE_INLINE = 5000
    """Rows merged on the event loop; more are downsampled in a worker thread."""

    def __init__(self, run: str | None, max_items: int = 256, max_rows: int = 4000,
                 max_backlog: int = 100_000, norms: Norms = "model"):
        self.run = run
        self.norms = norms
        """Whose norms the client's step rows carry (:mod:`server.modelnorms`)."""
        self.max_items = max_items
        self.max_rows = max_rows
        self.max_backlog = max_backlog
        self.decimated = 0
        self.too_slow: str | None = None
        """Why the client is to be dropped (it fell too far behind), once it is."""
        self.skip_until: dict[tuple[int, str], int] | None = None
        """Per (rank, opt), the last step the snapshot already held."""
        self._items: deque[Item] = deque()
        self._backlog: list[list[Row]] = []  # step rows past the queue, oldest first
        self._backlog_rows = 0
        self._other: list[Item] = []  # optimizer/deleted frames past the queue
        self._latest: dict[tuple[str, str], Item] = {}  # run/findings past the queue
        self._event = asyncio.Event()

    def offer(self, item: Item) -> None:
        """Queue a frame; never blocks, and O(1): a full queue sets rows aside."""
        if self.too_slow is not None:
            return
        if len(self._items) < self.max_items and not self._backlog:
            self._items.append(item)
        elif item.rows is not None:
            if not self._backlog:
                self.decimated += 1
            self._backlog.append(item.rows)
            self._backlog_rows += len(item.rows)
            if self._backlog_rows > self.max_backlog:
                self._drop(f"too slow: more than {self.max_backlog} step rows behind")
        elif item.kind in ("run", "findings"):
            self._latest[(item.kind, item.key)] = item  # only the newest state matters
        else:
            self._other.append(item)
            if len(self._other) > self.max_items:
                self._drop("too slow: the queue overflowed")
        self._event.set()

    def _drop(self, why: str) -> None:
        self.too_slow = why
        self._items.clear()
        self._backlog.clear()
        self._other.clear()
        self._latest.clear()

    def pending(self) -> int:
        """Frames :meth:`next` would return now (the set-aside rows count as one)."""
        return (len(self._items) + len(self._other) + len(self._latest)
                + (1 if self._backlog else 0))

    async def next(self) -> list[str]:
        """Wait for frames, then take every queued one (texts, oldest first).

        Returns an empty list once the client is :attr:`too_slow`.
        """
        await self._event.wait()
        self._event.clear()
        if self.too_slow is not None:
            return []
        items = list(self._items)
        self._items.clear()
        backlog, self._backlog, self._backlog_rows = self._backlog, [], 0
        items += self._other
        self._other = []
        latest, self._latest = list(self._latest.values()), {}
        if self.skip_until is not None:
            items = self._skip_old(items)
        texts = [it.text for it in items]
        if backlog and self.run is not None:
            rows = [r for part in backlog for r in part]
            if self.skip_until is not None:  # the snapshot is still newer than these
                rows = [r for r in rows
                        if r.step > self.skip_until.get((r.rank, r.opt), -1)]
            if rows:
                merge = _merged_text
                text = (merge(self.run, rows, self.max_rows) if len(rows) <= self.MERGE_INLINE
                        else await asyncio.to_thread(merge, self.run, rows, self.max_rows))
                texts.append(text)
        return texts + [it.text for it in latest]

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


def _merged_text(run: str, rows: list[Row], max_rows: int) -> str:
    """One ``decimated`` steps frame of rows set aside for a slow client."""
    small, bucket = downsample(rows, max_rows)
    return _steps_item(run, small, decimated=True, bucket=bucket, total=len(rows)).text

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
                 max_items: int = 256, max_rows: int = 4000, max_backlog: int = 100_000):
        self.summary_interval = summary_interval
        self.max_clients = max_clients
        self.max_items = max_items
        self.max_rows = max_rows
        self.max_backlog = max_backlog
        self._clients: set[Client] = set()
        self._last_sent: dict[str, float] = {}
        self._pending: dict[str, RunSummary] = {}

    def subscribe(self, run: str | None, norms: Norms = "model") -> Client | None:
        """A new client queue, or ``None`` when the client limit is reached.

        Args:
            norms: the norms its step rows carry: the model's or each rank's own.
        """
        if len(self._clients) >= self.max_clients:
            return None
        c = Client(run, self.max_items, self.max_rows, self.max_backlog, norms)
        self._clients.add(c)
        return c

    def unsubscribe(self, client: Client) -> None:
        """Forget a client (it left)."""
        self._clients.discard(client)

    def clients(self) -> int:
        """Number of live clients."""
        return len(self._clients)

    def _offer(self, run: str | None, item: Item, list_too: bool = False,
               norms: Norms | None = None) -> None:
        for c in list(self._clients):
            if (c.run == run and (norms is None or c.norms == norms)) or (
                    list_too and c.run is None):
                c.offer(item)

    def _watched(self, run: str, norms: Norms | None = None) -> bool:
        return any(c.run == run and (norms is None or c.norms == norms)
                   for c in self._clients)

    def watching(self, run: str) -> bool:
        """Whether a client watches ``run`` or lists runs (a run's summary reaches both)."""
        return any(c.run == run or c.run is None for c in self._clients)

    def watched(self, run: str, norms: Norms) -> bool:
        """Whether a client watches ``run`` with step rows of these norms."""
        return self._watched(run, norms)

    def publish_steps(self, run: str, rows: list[Row], norms: Norms | None = None) -> None:
        """New step rows of a run (already stored), for the clients of ``norms`` (None:
        every client)."""
        if rows and self._watched(run, norms):
            self._offer(run, _steps_item(run, rows, decimated=False), norms=norms)

    def publish_scalars(self, run: str,
                        values: list[Scalar]) -> None:
        """Values the user logged (already stored): (rank, opt, step, name, value)."""
        if values and self._watched(run):
            cols = dict(zip(("rank", "opt", "step", "name", "value"),
                            map(list, zip(*values, strict=True)), strict=True))
            text = frame_json(ScalarsFrame, run=run,
                              scalars={**cols, "total": len(values)})
            self._offer(run, Item("scalars", text))

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
        self._offer(summary.id, Item("run", RunFrame(run=summary).model_dump_json(),
                                     key=summary.id), True)
