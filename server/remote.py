"""Live frames across servers that share one database (PostgreSQL's LISTEN/NOTIFY).

A server that stores a batch, renames, annotates, interrupts or deletes a run announces it
in the same transaction (:func:`note_of`, sent by :meth:`server.backend.Database.announce`:
PostgreSQL delivers a notification only once its transaction commits). Every other server
listens (:meth:`server.backend.Database.listen`, on the ``gradwatch-listen`` thread) and
:class:`RemoteFeed`, on its event loop, reads what the note points at from the database
and hands it to its own live hub, so a dashboard on any server sees every run live. A note
names what changed (run, rank, step range), not the rows: a notification carries at most
8,000 bytes. SQLite has one server: there nothing is announced. Plain module: no FastAPI.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from typing import Any

from gradwatch.server.backend import Database, Reads
from gradwatch.server.batch import IngestResult
from gradwatch.server.fanout import Hub

log = logging.getLogger(__name__)

MAX_NOTE = 7_900
"""Bytes of a note at most (PostgreSQL's limit is 8,000)."""
MAX_PENDING = 10_000
"""Notes waiting for the event loop before new ones are dropped (logged)."""
ALL_ROWS = 1_000_000
"""``max_points`` of a note's step range: never downsampled (a batch is far smaller)."""


def note_of(server: str, run: str, res: IngestResult | None = None,
            deleted: bool = False) -> str:
    """The announcement of a change to ``run`` by ``server`` (JSON text).

    Args:
        res: what a stored batch changed; None for a change of the run's summary only.
        deleted: the run was deleted.
    """
    d: dict[str, Any] = {"from": server, "run": run}
    if deleted:
        d["deleted"] = True
    if res is not None:
        d["rank"] = res.rank
        if res.rows:
            d["steps"] = [min(r.step for r in res.rows), max(r.step for r in res.rows)]
        if res.optimizers:
            d["opts"] = sorted({v.opt for v in res.optimizers})
        if res.findings is not None:
            d["findings"] = True
        if res.scalars:
            d["scalars"] = res.scalars
    text = json.dumps(d, separators=(",", ":"))
    if len(text.encode()) > MAX_NOTE:  # many scalars: dashboards elsewhere read them later
        d.pop("scalars", None)
        text = json.dumps(d, separators=(",", ":"))
    return text


class RemoteFeed:
    """Publishes to this server's hub what other servers announce (see module doc).

    Args:
        server: this server's id (its own notes are skipped: published already).
        database: where to listen.
        reader: reads what a note points at.
        hub: where the frames go.
    """

    def __init__(self, server: str, database: Database, reader: Reads, hub: Hub):
        self.server, self.database, self.reader, self.hub = server, database, reader, hub
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._queue: asyncio.Queue[str] = asyncio.Queue(MAX_PENDING)
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        """Listen (a thread) and publish (a task); call on the event loop."""
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._publish_all())
        self._thread = threading.Thread(target=self.database.listen,
                                        args=(self._heard, self._stop),
                                        name="gradwatch-listen", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop listening and publishing."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        if self._task is not None:
            self._task.cancel()

    def _heard(self, text: str) -> None:
        """On the listening thread: hand a note to the event loop."""
        if self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self._loop.call_soon_threadsafe(self._put, text)

    def _put(self, text: str) -> None:
        try:
            self._queue.put_nowait(text)
        except asyncio.QueueFull:
            log.warning("live notes from other servers arrive faster than this server "
                        "reads them: one dropped (dashboards here catch up on reconnect)")

    async def _publish_all(self) -> None:
        while True:
            text = await self._queue.get()
            try:
                await self.publish(text)
            except Exception:  # one unreadable note must not end the feed
                log.exception("could not publish a note from another server")

    async def publish(self, text: str) -> None:
        """Publish what one note announces (read from the database)."""
        d = json.loads(text)
        if d.get("from") == self.server:
            return
        run = d["run"]
        if d.get("deleted"):
            self.hub.publish_deleted(run)
            return
        rank = d.get("rank")
        if rank is not None:
            if d.get("opts"):
                for v in await asyncio.to_thread(self.reader.optimizers, run):
                    if v.rank == rank and v.opt in d["opts"]:
                        self.hub.publish_optimizer(run, v)
            if d.get("steps"):
                lo, hi = d["steps"]
                got = await asyncio.to_thread(self.reader.steps, run, lo, hi, ALL_ROWS,
                                              None, rank)
                if got is not None:
                    self.hub.publish_steps(run, got.rows)
            if d.get("scalars"):
                self.hub.publish_scalars(run, [tuple(x) for x in d["scalars"]])
            if d.get("findings"):
                found = await asyncio.to_thread(self.reader.findings, run)
                if found is not None:
                    self.hub.publish_findings(run, found)
        summary = await asyncio.to_thread(self.reader.summary, run)
        if summary is not None:
            self.hub.publish_summary(summary)
