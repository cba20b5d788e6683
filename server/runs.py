"""The runs the server holds: stored by the writer, read by the reader, published live.

:class:`Runs` owns the storage writer, the reader, the live hub (and its feed of the
model's norms, :class:`~server.livemodel.LiveModel`), the stream tracker, the ingest gate
and the frame parser (``create_app`` puts one on ``app.state.runs``), and does
what touches several of them: store, then tell live clients. No FastAPI here: tests drive
it directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from gradwatch.frames import RunSummary
from gradwatch.server.backend import Storage
from gradwatch.server.batch import Batch, IngestResult, batch_of_records
from gradwatch.server.fanout import Hub
from gradwatch.server.files import private_dir
from gradwatch.server.importing import LogBlocks, batch_of_lines
from gradwatch.server.limits import IngestGate
from gradwatch.server.livemodel import LiveModel
from gradwatch.server.parsing import FrameParser
from gradwatch.server.remote import RemoteFeed
from gradwatch.server.settings import Settings
from gradwatch.server.storage import Store
from gradwatch.server.streams import StreamTracker

log = logging.getLogger(__name__)

PARSE_LINES = 512
"""Lines validated in the pool at a time: a block of a few hundred lines keeps every parser
busy from the log's first bytes to its last (a 1 MiB piece holds about 3,000)."""
T = TypeVar("T")


class Runs:
    """Everything ``create_app`` puts on ``app.state.runs``.

    Args:
        settings: the server settings (data dir, limits).
    """

    def __init__(self, settings: Settings):
        self.settings = settings
        if settings.db is None:
            private_dir(settings.data_dir)
        self.store: Storage = Store(settings.database(), max_runs=settings.max_runs,
                                    keep_param_norms=settings.keep_param_norms)
        self.reader = self.store.reader
        self.hub = Hub(summary_interval=settings.summary_interval,
                       max_clients=settings.max_live_clients, max_items=settings.live_queue,
                       max_backlog=settings.live_backlog)
        self.model = LiveModel(self.reader, self.hub)
        self.streams = StreamTracker(settings.interrupted_after, self._lost)
        self.gate = IngestGate(settings.max_ingest_connections, settings.max_msgs_per_sec)
        self.parser = FrameParser(settings.parse_processes)
        self._tasks: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self.remote = RemoteFeed(self.store.server, self.store.database, self.reader, self)

    def start(self) -> None:
        """Start the storage writer, the frame parser and the feed of other servers'
        changes (call on the event loop)."""
        self.store.start()
        self.parser.start()
        self.remote.start()
        if self.store.database.shared:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_every(
                max(1.0, self.settings.interrupted_after)))

    def close(self) -> None:
        """Finish queued writes and close the database."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        self.remote.close()
        self.parser.close()
        self.store.close()
        self.reader.close()

    async def write(self, fn: Callable[..., T], *args: Any, run: str | None = None,
                    timer: bool = False) -> T:
        """Run a storage operation on the writer thread and await it (``run``, ``timer``:
        :meth:`Store.submit`'s).

        Raises:
            StoreBusy: too many writes are queued; and whatever ``fn`` raises.
        """
        return await asyncio.wrap_future(self.store.submit(fn, *args, run=run, timer=timer))

    def publish(self, res: IngestResult) -> None:
        """Hand a stored batch's changes to live clients."""
        for view in res.optimizers:
            self.hub.publish_optimizer(res.run, view)
        self.hub.publish_steps(res.run, res.rows, "rank")
        self.model.publish(res)  # the model's norms: once every rank has the step
        self.hub.publish_scalars(res.run, res.scalars)
        if res.findings is not None:
            self.hub.publish_findings(res.run, res.findings)
        if res.summary is not None and (res.stored or res.new_run):
            self.hub.publish_summary(res.summary)

    async def delete(self, run: str) -> bool:
        """Delete a run; tell live clients. ``False`` if there is none."""
        ok = await self.write(self.store.delete, run, run=run)
        if ok:
            self.deleted(run)
        return ok

    def deleted(self, run: str) -> None:
        """A run was deleted (here or by another server): tell live clients."""
        self.model.forget(run)
        self.hub.publish_deleted(run)

    def watching(self, run: str) -> bool:
        """Whether a live client watches ``run`` or lists runs."""
        return self.hub.watching(run)

    async def rename(self, run: str, name: str) -> RunSummary | None:
        """Give a run a new display name; tell live clients. ``None`` if there is none.

        Raises:
            NameTaken: another run has that name.
            StoreBusy: the writer's queue is full.
        """
        summary = await self.write(self.store.rename, run, name, run=run)
        if summary is not None:
            self.hub.publish_summary(summary)
        return summary

    async def annotate(self, run: str, notes: str | None, tags: list[str] | None
                       ) -> RunSummary | None:
        """Set a run's notes and/or tags; tell live clients. ``None`` if there is none.

        Raises:
            StoreBusy: the writer's queue is full.
        """
        summary = await self.write(self.store.annotate, run, notes, tags, run=run)
        if summary is not None:
            self.hub.publish_summary(summary)
        return summary

    async def import_stream(self, chunks: AsyncIterator[bytes], name: str = "upload",
                            display: str | None = None) -> tuple[str, int, list[str]]:
        """Store a step log as a new run as it arrives, a block at a time: validating
        block k+1 while block k is stored. Stored whole or not at all: a refused line
        deletes what was stored of the run.

        Args:
            chunks: the log's bytes, in pieces of any size.
            name: what errors call the log.
            display: the run's display name (default: the header's).
        Returns:
            The run id, the number of step records stored, and warnings.
        Raises:
            InvalidLog: a line is not a valid record (nothing stored).
            RunLimitReached, StoreBusy, StorageFailed: nothing was stored.
        """
        blocks = LogBlocks(name, max_bytes=self.settings.max_import_bytes,
                           max_line=self.settings.max_line_bytes)
        run_id: str | None = None
        steps = 0
        parsing: deque[asyncio.Future[Batch]] = deque()
        writing: asyncio.Future[IngestResult] | None = None

        async def store_next() -> None:
            """Hand the oldest parsed block to the writer once the one before is stored."""
            nonlocal writing, steps
            batch = await parsing.popleft()
            if writing is not None:
                steps += len((await writing).rows)
            writing = asyncio.wrap_future(self.store.submit(self.store.ingest, batch,
                                                               run=batch.run))

        async def block(lines: list[tuple[int, bytes]]) -> None:
            nonlocal run_id
            if run_id is None:  # the header line: read here, the run made from it
                blocks.parse(lines[:1])
                if blocks.header is None:
                    return
                run_id = await self.write(self.store.import_start, blocks.header, display)
                lines = lines[1:]
                if not lines:
                    return
            # every other line: validated in the parser pool, several blocks at once (the
            # header's block too: this process stores while the pool parses)
            assert blocks.header is not None
            parsing.append(asyncio.ensure_future(self.parser.run(
                batch_of_lines, name, lines, run_id, blocks.header.rank, blocks.header.v)))
            while len(parsing) > self.parser.workers:
                await store_next()

        try:
            async for data in chunks:
                for lines in blocks.pieces(data):
                    for i in range(0, len(lines), PARSE_LINES):
                        await block(lines[i:i + PARSE_LINES])
                    await asyncio.sleep(0)  # a gzip chunk inflates to many blocks
            tail = blocks.finish()
            if tail:  # a possibly truncated last line: read here, where warnings are kept
                if run_id is None:
                    await block(tail)
                else:
                    recs = blocks.parse(tail)
                    fut = asyncio.get_running_loop().create_future()
                    fut.set_result(batch_of_records(run_id, blocks.header.rank, recs)
                                   if recs and blocks.header is not None
                                   else Batch(run_id, 0, []))
                    parsing.append(fut)
            blocks.check_end()
            while parsing:
                await store_next()
            if writing is not None:
                steps += len((await writing).rows)
            writing = None
            assert run_id is not None
            await self.write(self.store.import_end, run_id, run=run_id)
        except BaseException:
            pending: list[asyncio.Future[Any]] = [*parsing]
            if writing is not None:
                pending.append(writing)
            for fut in pending:
                with contextlib.suppress(BaseException):
                    await fut
            if run_id is not None:
                await asyncio.shield(self._forget(run_id))
            raise
        summary = await asyncio.to_thread(self.reader.summary, run_id)
        if summary is not None:
            self.hub.publish_summary(summary)
        return run_id, steps, blocks.warnings

    async def _forget(self, run_id: str) -> None:
        try:
            await self.write(self.store.delete, run_id, run=run_id)
        except Exception:
            log.exception("could not delete the partly imported run %s", run_id)

    def _lost(self, run: str) -> None:
        task = asyncio.get_running_loop().create_task(self._mark_interrupted(run))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _sweep_every(self, seconds: float) -> None:
        """On a shared database: now and then, the live runs whose server died with their
        stream read as interrupted (:meth:`Store.sweep`; other servers hear of it)."""
        while True:
            await asyncio.sleep(seconds)
            try:
                marked = await self.write(self.store.sweep, timer=True)
            except Exception:  # a busy writer or a database away: the next round
                log.debug("sweep skipped", exc_info=True)
                continue
            for run in marked:
                summary = await asyncio.to_thread(self.reader.summary, run)
                if summary is not None:
                    self.hub.publish_summary(summary)

    async def _mark_interrupted(self, run: str) -> None:
        try:
            summary = await self.write(self.store.mark_interrupted, run, run=run)
        except Exception:
            log.exception("could not mark run %s interrupted", run)
            return
        if summary is not None:
            log.info("run %s: stream lost without End; marked interrupted", run)
            self.hub.publish_summary(summary)
