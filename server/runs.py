"""The server's core, bundled: storage writer, reader, live hub and stream tracker.

Routes call these coroutines; they run storage work off the event loop and publish what
changed to live clients. No FastAPI here: tests drive a :class:`Service` directly.
"""

from __future__ import annotations

import asyncio
import logging
import os
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from typing import Any

from gradwatch.frames import Hello
from gradwatch.server.digest import exit_with_parent, parse_to_digest
from gradwatch.server.fanout import Hub
from gradwatch.server.ingest import StreamTracker
from gradwatch.server.queries import Reader
from gradwatch.server.settings import Settings
from gradwatch.server.storage import IngestResult, Store
from gradwatch.wire import Header

log = logging.getLogger(__name__)

PARSE_INLINE_BYTES = 32 << 10
"""Smaller frames (hellos, a few records) are validated right on the event loop."""


class Service:
    """Everything ``create_app`` puts on ``app.state.service``.

    Args:
        settings: the server settings (data dir, limits).
    """

    def __init__(self, settings: Settings):
        self.settings = settings
        self.store = Store(settings.data_dir, max_runs=settings.max_runs)
        self.reader = Reader(settings.data_dir)
        self.hub = Hub(summary_interval=settings.summary_interval,
                       max_clients=settings.max_live_clients, max_items=settings.live_queue)
        self.tracker = StreamTracker(settings.interrupted_after, self._lost)
        # Validating frames is the costliest part of ingest and holds the GIL: worker
        # processes take it off this process's GIL (settings.parse_processes); else one
        # thread for all connections, so a crowd of parsing threads never fights the writer.
        self.parser: Executor = (
            ProcessPoolExecutor(settings.parse_processes, mp_context=get_context("spawn"),
                                initializer=exit_with_parent, initargs=(os.getpid(),))
            if settings.parse_processes > 0 else ThreadPoolExecutor(1, "gradwatch-parse"))
        self._tasks: set[asyncio.Task[Any]] = set()

    def start(self) -> None:
        """Start the storage writer (and warm up the parser processes)."""
        self.store.start()
        if isinstance(self.parser, ProcessPoolExecutor):
            self.parser.submit(parse_to_digest, Hello(run="warm-up").model_dump_json())

    async def parse(self, text: str) -> tuple[str, Any]:
        """Validate an ingest frame (see :func:`parse_to_digest`), off the event loop."""
        if len(text) < PARSE_INLINE_BYTES:
            return parse_to_digest(text)
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.parser, parse_to_digest, text)
        except BrokenProcessPool:
            log.error("the frame parser process died; parsing in a thread from now on")
            self.parser = ThreadPoolExecutor(1, "gradwatch-parse")
            return await loop.run_in_executor(self.parser, parse_to_digest, text)

    def close(self) -> None:
        """Finish queued writes and close the database."""
        self.parser.shutdown(wait=True)
        self.store.close()
        self.reader.close()

    async def write(self, fn: Any, *args: Any) -> Any:
        """Run a storage operation on the writer thread and await it."""
        return await asyncio.wrap_future(self.store.submit(fn, *args))

    def publish(self, res: IngestResult) -> None:
        """Hand a stored batch's changes to live clients."""
        for view in res.optimizers:
            self.hub.publish_optimizer(res.run, view)
        self.hub.publish_steps(res.run, res.rows)
        if res.findings is not None:
            self.hub.publish_findings(res.run, res.findings)
        if res.summary is not None and (res.stored or res.new_run):
            self.hub.publish_summary(res.summary)

    async def delete(self, run: str) -> bool:
        """Delete a run; tell live clients. ``False`` if there is none."""
        ok: bool = await self.write(self.store.delete, run)
        if ok:
            self.hub.publish_deleted(run)
        return ok

    async def import_log(self, header: Header, records: list[Any]) -> tuple[str, int]:
        """Store a parsed step log as a new run; returns its id and step count."""
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
