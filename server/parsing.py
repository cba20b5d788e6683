"""Ingest frames validated against the wire contract: the server's trust boundary.

A frame is validated once, here, into a :class:`~gradwatch.frames.Hello` or a
:class:`~server.batch.Batch`; the rest of the server passes those on. Validation is the
costliest step of ingest and holds the GIL, so :class:`FrameParser` can run it in worker
processes. Plain module: no FastAPI.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from typing import Annotated, Any, TypeVar

from pydantic import Field, TypeAdapter, ValidationError

from gradwatch.frames import Hello
from gradwatch.gcpause import gc_paused
from gradwatch.server.batch import Batch, batch_of
from gradwatch.server.errors import InvalidFrame, UnreadableFrame
from gradwatch.validation import plain_error
from gradwatch.wire import IngestBatch

log = logging.getLogger(__name__)
T = TypeVar("T")

_FRAME: TypeAdapter[Hello | IngestBatch] = TypeAdapter(
    Annotated[Hello | IngestBatch, Field(discriminator="type")])

INLINE_BYTES = 32 << 10
"""Frames shorter than this (hellos, a few records) are validated on the event loop."""


def parse_frame(text: str) -> Hello | Batch:
    """Validate one ingest frame.

    Raises:
        UnreadableFrame: it is not JSON.
        InvalidFrame: it is not a valid frame (the reason names the first wrong field).
    """
    try:
        with gc_paused():
            frame = _FRAME.validate_json(text)
            return frame if isinstance(frame, Hello) else batch_of(frame)
    except ValidationError as e:
        err = e.errors()[0]
        detail = str(err.get("ctx", {}).get("error", ""))
        # An integer of 4300+ digits is JSON all the same: an invalid frame, not unreadable.
        if err.get("type") == "json_invalid" and not detail.startswith("number out of range"):
            raise UnreadableFrame("frame is not JSON; send IngestBatch JSON text "
                                  "frames") from None
        raise InvalidFrame(f"invalid frame: {plain_error(e, 'frame')}") from None


PARSER_NICE = 10
"""How much lower a parser process's scheduling priority is than the server's."""
COLLECT_EVERY = 30.0
"""Seconds between a parser process's garbage collections (its collector is off between)."""


def worker_init(parent: int) -> None:
    """In a parser process: exit when the server process is gone (even after kill -9), and
    leave Ctrl-C to the server (it reaches the whole process group; the server stops the
    pool itself), so a stop prints no traceback per process.

    The cycle collector is off here and runs every :data:`COLLECT_EVERY` seconds instead: a
    parser makes only acyclic records, which refcounting frees, and with the collector on
    each block's survivors were walked again and again (:mod:`gradwatch.gcpause`); what a
    rare cycle holds (an error's traceback) waits for the next collection.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):  # spawned with it blocked: see sigint_held()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    gc.disable()
    with contextlib.suppress(OSError):  # bulk work: the server process (live frames, acks,
        os.nice(PARSER_NICE)            # storage) runs first when the cores are short

    def watch() -> None:
        last = time.monotonic()
        while os.getppid() == parent:
            time.sleep(1.0)
            if time.monotonic() - last >= COLLECT_EVERY:
                gc.collect()
                last = time.monotonic()
        os._exit(0)

    threading.Thread(target=watch, name="gradwatch-parent-watch", daemon=True).start()


@contextlib.contextmanager
def sigint_held() -> Iterator[None]:
    """Hold SIGINT back from this thread, and from the processes it spawns meanwhile.

    A spawned process inherits the signal mask across fork and exec, so a Ctrl-C that
    reaches the process group while a parser process is still importing stays pending in it
    until :func:`worker_init` ignores it, instead of raising a KeyboardInterrupt traceback
    there (multiprocessing's resource tracker is started the same way). The server loses
    no Ctrl-C: its other threads take it meanwhile, or this one once released.
    """
    if not hasattr(signal, "pthread_sigmask"):  # Windows: no process groups to signal
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class FrameParser:
    """Runs :func:`parse_frame` off the event loop.

    Args:
        processes: worker processes (they take validation off this process's GIL); 0: one
            thread for every connection, so a crowd of parsing threads never fights the
            storage writer.
    """

    def __init__(self, processes: int = 0):
        self._pool: Executor = (
            ProcessPoolExecutor(processes, mp_context=get_context("spawn"),
                                initializer=worker_init, initargs=(os.getpid(),))
            if processes > 0 else ThreadPoolExecutor(1, "gradwatch-parse"))
        self._warm: list[Future[Any]] = []
        self._busy: set[Future[Any]] = set()

    def start(self) -> None:
        """Start every worker process and warm it up (they import the wire models on first
        use): submitted together, no worker is idle yet, so the pool starts one each."""
        if isinstance(self._pool, ProcessPoolExecutor):
            hello = Hello(run="warm-up").model_dump_json()
            with sigint_held():  # submit() spawns the processes
                self._warm = [self._pool.submit(parse_frame, hello)
                              for _ in range(self.workers)]

    async def started(self) -> None:
        """Once the workers :meth:`start` warmed up are ready (nothing to wait for in a
        thread)."""
        for fut in self._warm:
            await asyncio.wrap_future(fut)

    async def parse(self, text: str) -> Hello | Batch:
        """:func:`parse_frame`, in the pool unless the frame is small.

        Raises:
            UnreadableFrame, InvalidFrame: as :func:`parse_frame`.
        """
        if len(text) < INLINE_BYTES:
            return parse_frame(text)
        return await self.run(parse_frame, text)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the pool (a module-level function: it may cross to a process)."""
        try:
            return await self._submit(fn, *args)
        except BrokenProcessPool:
            log.error("the frame parser process died; parsing in a thread from now on")
            self._pool = ThreadPoolExecutor(1, "gradwatch-parse")
            return await self._submit(fn, *args)

    def _submit(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        fut = self._pool.submit(fn, *args)
        self._busy.add(fut)  # until done: close() waits for it
        fut.add_done_callback(self._busy.discard)
        return asyncio.wrap_future(fut)

    @property
    def workers(self) -> int:
        """Jobs the pool runs at once."""
        return max(1, getattr(self._pool, "_max_workers", 1))

    def close(self) -> None:
        """Finish frames being parsed and stop the pool.

        The idle parser processes are then killed, not asked to exit: they hold nothing to
        release, and at their lowered priority on a busy machine their orderly exit held
        the server's stop for seconds.
        """
        futures.wait(list(self._busy))
        # ProcessPoolExecutor's own way (kill_workers) is Python 3.14's; its process map
        # is the same attribute from 3.8 to 3.13.
        for proc in list((getattr(self._pool, "_processes", None) or {}).values()):
            with contextlib.suppress(OSError):
                proc.kill()
        self._pool.shutdown(wait=True)
