"""The storage writer's threads: one runs the write jobs, in the order they were submitted;
a helper copies the WAL into the database (checkpoints) so the writer's commits stay short.

:class:`~server.storage.Store` owns one and submits its operations through it. Plain module:
no FastAPI, no SQL beyond the checkpoint.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from gradwatch.server import db
from gradwatch.server.errors import StoreBusy

log = logging.getLogger(__name__)
T = TypeVar("T")
_Job = tuple[Callable[..., Any], tuple[Any, ...], "cf.Future[Any]"]


class WriterThread:
    """A bounded job queue, the thread that runs it, and the checkpoint thread.

    Args:
        data_dir: the data directory (the checkpoint thread opens its own connection).
        queue_size: jobs queued before :meth:`submit` raises :class:`StoreBusy`.
        checkpoint_every: seconds between passive checkpoints.
    """

    def __init__(self, data_dir: Path, queue_size: int = 256, checkpoint_every: float = 0.5):
        self.data_dir = data_dir
        self.checkpoint_every = checkpoint_every
        self._jobs: queue.Queue[_Job | None] = queue.Queue(maxsize=queue_size)
        self._thread: threading.Thread | None = None
        self._stop_ckpt = threading.Event()
        self._ckpt: threading.Thread | None = None

    def start(self) -> None:
        """Start both threads."""
        self._thread = threading.Thread(target=self._loop, name="gradwatch-store",
                                        daemon=True)
        self._thread.start()
        self._ckpt = threading.Thread(target=self._checkpoints, name="gradwatch-checkpoint",
                                      daemon=True)
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

    def _checkpoints(self) -> None:
        conn = db.connect(self.data_dir)
        try:
            while not self._stop_ckpt.wait(self.checkpoint_every):
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                except Exception:  # busy or I/O trouble: the next round retries
                    log.debug("checkpoint failed", exc_info=True)
        finally:
            conn.close()
