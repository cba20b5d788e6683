"""The runs the server holds: stored by the writer, read by the reader, published live.

:class:`Runs` owns the storage writer, the reader, the live hub, the stream tracker, the
ingest gate and the frame parser (``create_app`` puts one on ``app.state.runs``), and does
what touches several of them: store, then tell live clients. No FastAPI here: tests drive
it directly.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from gradwatch.frames import RunSummary
from gradwatch.server.batch import IngestResult, RecordModel
from gradwatch.server.fanout import Hub
from gradwatch.server.files import private_dir
from gradwatch.server.limits import IngestGate
from gradwatch.server.parsing import FrameParser
from gradwatch.server.reader import Reader
from gradwatch.server.settings import Settings
from gradwatch.server.storage import Store
from gradwatch.server.streams import StreamTracker
from gradwatch.wire import Header

log = logging.getLogger(__name__)
T = TypeVar("T")


class Runs:
    """Everything ``create_app`` puts on ``app.state.runs``.

    Args:
        settings: the server settings (data dir, limits).
    """

    def __init__(self, settings: Settings):
        self.settings = settings
        private_dir(settings.data_dir)
        self.store = Store(settings.data_dir, max_runs=settings.max_runs)
        self.reader = Reader(settings.data_dir)
        self.hub = Hub(summary_interval=settings.summary_interval,
                       max_clients=settings.max_live_clients, max_items=settings.live_queue,
                       max_backlog=settings.live_backlog)
        self.streams = StreamTracker(settings.interrupted_after, self._lost)
        self.gate = IngestGate(settings.max_ingest_connections, settings.max_msgs_per_sec)
        self.parser = FrameParser(settings.parse_processes)
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        """Start the storage writer and the frame parser."""
        self.store.start()
        self.parser.start()

    def close(self) -> None:
        """Finish queued writes and close the database."""
        self.parser.close()
        self.store.close()
        self.reader.close()

    async def write(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a storage operation on the writer thread and await it.

        Raises:
            StoreBusy: too many writes are queued; and whatever ``fn`` raises.
        """
        return await asyncio.wrap_future(self.store.submit(fn, *args))

    def publish(self, res: IngestResult) -> None:
        """Hand a stored batch's changes to live clients."""
        for view in res.optimizers:
            self.hub.publish_optimizer(res.run, view)
        self.hub.publish_steps(res.run, res.rows)
        self.hub.publish_scalars(res.run, res.scalars)
        if res.findings is not None:
            self.hub.publish_findings(res.run, res.findings)
        if res.summary is not None and (res.stored or res.new_run):
            self.hub.publish_summary(res.summary)

    async def delete(self, run: str) -> bool:
        """Delete a run; tell live clients. ``False`` if there is none."""
        ok = await self.write(self.store.delete, run)
        if ok:
            self.hub.publish_deleted(run)
        return ok

    async def rename(self, run: str, name: str) -> RunSummary | None:
        """Give a run a new display name; tell live clients. ``None`` if there is none.

        Raises:
            NameTaken: another run has that name.
            StoreBusy: the writer's queue is full.
        """
        summary = await self.write(self.store.rename, run, name)
        if summary is not None:
            self.hub.publish_summary(summary)
        return summary

    async def import_log(self, header: Header, records: list[RecordModel]) -> tuple[str, int]:
        """Store a validated step log as a new run; returns its id and step count.

        Raises:
            RunLimitReached, InvalidStream, StoreBusy: nothing was stored.
        """
        run_id, steps = await self.write(self.store.import_log, header, records)
        summary = await asyncio.to_thread(self.reader.summary, run_id)
        if summary is not None:
            self.hub.publish_summary(summary)
        return run_id, steps

    def _lost(self, run: str) -> None:
        task = asyncio.get_running_loop().create_task(self._mark_interrupted(run))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _mark_interrupted(self, run: str) -> None:
        try:
            summary = await self.write(self.store.mark_interrupted, run)
        except Exception:
            log.exception("could not mark run %s interrupted", run)
            return
        if summary is not None:
            log.info("run %s: stream lost without End; marked interrupted", run)
            self.hub.publish_summary(summary)
