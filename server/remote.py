"""Live frames across servers that share one database (PostgreSQL's LISTEN/NOTIFY).

A server that stores a batch, renames, annotates, interrupts or deletes a run announces it
in the same transaction (:func:`note_of`, sent by :meth:`server.backend.Database.bump`:
PostgreSQL delivers a notification only once its transaction commits). Every other server
listens (:meth:`server.backend.Database.listen`, on the ``gradwatch-listen`` thread) and
:class:`RemoteFeed`, on its event loop, reads what the note points at from the database
and hands it to its own live clients the way its own batches go
(:meth:`server.runs.Runs.publish`: the model's norms of a sharded run included), so a
dashboard on any server sees every run live. A note names what changed (run, rank, step
range), not the rows: a notification carries at most 8,000 bytes. Notes that wait are
merged per run (:func:`merged`: one read per run, not per batch, so a busy database's
notes cannot pile up behind their reads), and nothing is read for a run no client here
watches or lists. SQLite has one server: there nothing is announced. Plain module: no
FastAPI.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from gradwatch.server.backend import Database, Reads
from gradwatch.server.batch import IngestResult
from gradwatch.server.rows import Scalar

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


@dataclass
class Change:
    """What the waiting notes about one run announce, merged (:func:`merged`)."""

    run: str
    deleted: bool = False
    steps: dict[int, list[list[int]]] = field(default_factory=dict)
    """Per rank, its stored step ranges ``[lo, hi]`` (overlapping or adjacent ones joined)."""
    opts: dict[int, set[str]] = field(default_factory=dict)
    """Per rank, the optimizers that appeared."""
    findings: bool = False
    scalars: list[Scalar] = field(default_factory=list)

    def add(self, d: dict[str, Any]) -> None:
        """Merge one note (parsed) about this run."""
        rank = d.get("rank")
        if rank is None:  # the run's summary only: read anyway
            return
        if d.get("steps"):
            lo, hi = d["steps"]
            ranges = self.steps.setdefault(rank, [])
            for r in ranges:
                if lo <= r[1] + 1 and hi >= r[0] - 1:
                    r[0], r[1] = min(r[0], lo), max(r[1], hi)
                    break
            else:
                ranges.append([lo, hi])
        if d.get("opts"):
            self.opts.setdefault(rank, set()).update(d["opts"])
        self.findings |= bool(d.get("findings"))
        self.scalars += [tuple(x) for x in d.get("scalars", ())]

    def ranks(self) -> list[int]:
        """The ranks whose rows or optimizers changed, in order."""
        return sorted({*self.steps, *self.opts, *(s[0] for s in self.scalars)})


def merged(texts: Iterable[str], server: str) -> list[Change]:
    """The changes ``texts`` announce, one per run in the order runs first appear; a
    deletion ends its run's change (a run made again after it is a new change). Notes of
    ``server`` itself are skipped (published already); an unreadable one is logged."""
    out: list[Change] = []
    open_: dict[str, Change] = {}
    for text in texts:
        try:
            d = json.loads(text)
            if d.get("from") == server:
                continue
            run = d["run"]
            if d.get("deleted"):
                open_.pop(run, None)
                out.append(Change(run, deleted=True))
                continue
            c = open_.get(run)
            if c is None:
                c = open_[run] = Change(run)
                out.append(c)
            c.add(d)
        except Exception:  # one unreadable note must not end the feed
            log.exception("unreadable note from another server: %.200r", text)
    return out


class Sink(Protocol):
    """Where a server's own stored changes go live (:class:`server.runs.Runs`)."""

    def publish(self, res: IngestResult) -> None:
        """A stored batch's changes."""

    def deleted(self, run: str) -> None:
        """A run was deleted."""

    def watching(self, run: str) -> bool:
        """Whether a client here watches ``run`` or lists runs."""


class RemoteFeed:
    """Publishes to this server's clients what other servers announce (see module doc).

    Args:
        server: this server's id (its own notes are skipped: published already).
        database: where to listen.
        reader: reads what a note points at.
        sink: where the changes go.
    """

    def __init__(self, server: str, database: Database, reader: Reads, sink: Sink):
        self.server, self.database, self.reader, self.sink = server, database, reader, sink
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
            texts = [await self._queue.get()]
            while not self._queue.empty():  # everything that waited: merged per run
                texts.append(self._queue.get_nowait())
            for change in merged(texts, self.server):
                try:
                    await self.publish(change)
                except Exception:  # one unreadable change must not end the feed
                    log.exception("could not publish a change of run %s from another "
                                  "server", change.run)

    async def publish(self, change: Change) -> None:
        """Publish one run's change, read from the database."""
        run = change.run
        if change.deleted:
            self.sink.deleted(run)
            return
        if not self.sink.watching(run):
            return  # nobody here to tell: nothing read
        # one worker hop for all its reads: each hop waits for a thread and the loop
        for res in await asyncio.to_thread(self._read, change):
            self.sink.publish(res)

    def _read(self, change: Change) -> list[IngestResult]:
        """On a worker thread: what ``change`` points at, as one result per rank (none:
        the run was deleted meanwhile, its deletion note follows)."""
        run = change.run
        views = self.reader.optimizers(run) if change.opts else []
        found = self.reader.findings(run) if change.findings else None
        summary = self.reader.summary(run)
        if summary is None:
            return []
        ranks = change.ranks() or [0]
        out = []
        for i, rank in enumerate(ranks):
            rows = []
            for lo, hi in change.steps.get(rank, ()):
                got = self.reader.steps(run, lo, hi, ALL_ROWS, None, rank)
                if got is not None:
                    rows += got.rows
            last = i == len(ranks) - 1
            opts = change.opts.get(rank, set())
            # a note is sent only for a committed change: at least one record counts
            out.append(IngestResult(
                run=run, rank=rank, ack=-1, stored=max(1, len(rows)), rows=rows,
                optimizers=[v for v in views if v.rank == rank and v.opt in opts],
                findings=found if last else None, summary=summary if last else None,
                scalars=[s for s in change.scalars if s[0] == rank]))
        return out
