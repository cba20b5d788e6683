"""The storage writer's threads: one runs the write jobs, in the order they were submitted;
a helper runs the database's housekeeping beside it (SQLite: copies the WAL into the
database, so the writer's commits stay short).

:class:`~server.storage.Store` owns one and submits its operations through it. Plain module:
no FastAPI, no SQL.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from gradwatch.server.errors import StoreBusy

log = logging.getLogger(__name__)
T = TypeVar("T")
_Job = tuple[Callable[..., Any], tuple[Any, ...], "cf.Future[Any]"]


class WriterThread:
    """A bounded job queue, the thread that runs it, and the housekeeping thread.

    Args:
        housekeeping: runs on its own thread until the event it is given is set
            (:meth:`server.backend.Database.housekeeping`).
        queue_size: jobs queued before :meth:`submit` raises :class:`StoreBusy`.
    """

    def __init__(self, housekeeping: Callable[[threading.Event], None],
                 queue_size: int = 256):
        self.housekeeping = housekeeping
        self._jobs: queue.Queue[_Job | None] = queue.Queue(maxsize=queue_size)
        self._thread: threading.Thread | None = None
        self._stop_ckpt = threading.Event()
        self._ckpt: threading.Thread | None = None

    def start(self) -> None:
        """Start both threads."""
        self._thread = threading.Thread(target=self._loop, name="gradwatch-store",
                                        daemon=True)
        self._thread.start()
        self._ckpt = threading.Thread(target=self.housekeeping, args=(self._stop_ckpt,),
                                      name="gradwatch-checkpoint", daemon=True)
        self._ckpt.start()

    def submit(self, fn: Callable[..., T], *args: Any) -> cf.Future[T]:
        """Run ``fn(*args)`` on the writer thread, after every job submitted before it.

        Raises:
            StoreBusy: too many jobs are already queued.
        """
        fut: cf.Future[T] = cf.Future()
        try:
            self._jobs.put_nowait((fn, args, fut))
        except queue.Full:
            raise StoreBusy("the server's storage is busy; retry later") from None
        return fut

    def stop(self, timeout: float = 30.0) -> None:
        """Run the jobs already queued, then stop both threads."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join(timeout)
            self._thread = None
        self._stop_ckpt.set()
        if self._ckpt is not None:
            self._ckpt.join(timeout)
            self._ckpt = None

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, args, fut = job
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args))
            except BaseException as e:  # handed to whoever awaits the job
                fut.set_exception(e)
