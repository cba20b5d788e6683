"""The storage writer's threads: one runs the write jobs, a helper runs the database's
housekeeping beside it (SQLite: copies the WAL into the database, so the writer's commits
stay short).

Jobs run in the order they were submitted, with one exception: a job marked ``urgent``
(a live client's small batch, :mod:`server.ws_ingest`) goes ahead of the queued jobs of
other runs, so it does not wait behind other streams' bulk batches. A run's jobs keep
their order (a job goes to the urgent lane only while no job of its run waits in the
other), a job of no run (but a timer's) is overtaken by none submitted after it, and after
:data:`FAIR` urgent jobs in a row the oldest other job runs (bulk is never starved).

:class:`~server.storage.Store` owns one and submits its operations through it. Plain module:
no FastAPI, no SQL.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import threading
from collections import Counter, deque
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

from gradwatch.server.errors import StoreBusy

log = logging.getLogger(__name__)
T = TypeVar("T")

FAIR = 8
"""Urgent jobs run in a row at most while other jobs wait; then the oldest other one."""


class _Job(NamedTuple):
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    fut: cf.Future[Any]
    run: str | None
    """The run the job reads or writes; None: any."""
    barrier: bool
    """No urgent job submitted after it runs before it (a job of no run, unless its moment
    is arbitrary anyway: a timer's)."""


class _Lanes:
    """The queued jobs: an urgent lane and a lane of the others, each first in first out.

    A job joins the urgent lane only while no job of its run and no barrier waits in the
    other lane, and the urgent jobs queued before a barrier run before it: so a run's jobs
    run in their order, and no urgent job passes a barrier (see the module doc).
    """

    def __init__(self, size: int):
        self.size = size
        self.urgent: deque[_Job] = deque()
        self.other: deque[_Job] = deque()
        self._runs: dict[bool, Counter[str | None]] = {True: Counter(), False: Counter()}
        self._barriers = 0  # in the other lane
        self._streak = 0  # urgent jobs run in a row while others waited

    def __len__(self) -> int:
        return len(self.urgent) + len(self.other)

    def put(self, job: _Job, urgent: bool) -> None:
        """Queue ``job`` (ahead of other runs' if ``urgent`` and nothing forbids it)."""
        fast = (job.run is not None and not self._barriers
                and not self._runs[False][job.run]
                and (urgent or bool(self._runs[True][job.run])))
        (self.urgent if fast else self.other).append(job)
        self._runs[fast][job.run] += 1
        self._barriers += job.barrier

    def take(self) -> _Job:
        """The next job to run (the lanes are not both empty)."""
        fast = bool(self.urgent) and (
            not self.other or self.other[0].barrier or self._streak < FAIR)
        job = (self.urgent if fast else self.other).popleft()
        self._streak = self._streak + 1 if fast and self.other else 0
        self._barriers -= job.barrier
        left = self._runs[fast]
        left[job.run] -= 1
        if not left[job.run]:
            del left[job.run]
        return job


class WriterThread:
    """The job lanes, the thread that runs them, and the housekeeping thread.

    Args:
        housekeeping: runs on its own thread until the event it is given is set
            (:meth:`server.backend.Database.housekeeping`).
        queue_size: jobs queued before :meth:`submit` raises :class:`StoreBusy`.
    """

    def __init__(self, housekeeping: Callable[[threading.Event], None],
                 queue_size: int = 256):
        self.housekeeping = housekeeping
        self._lanes = _Lanes(queue_size)
        self._ready = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._stop_ckpt = threading.Event()
        self._ckpt: threading.Thread | None = None

    def start(self) -> None:
        """Start both threads."""
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="gradwatch-store",
                                        daemon=True)
        self._thread.start()
        self._ckpt = threading.Thread(target=self.housekeeping, args=(self._stop_ckpt,),
                                      name="gradwatch-checkpoint", daemon=True)
        self._ckpt.start()

    def submit(self, fn: Callable[..., T], *args: Any, run: str | None = None,
               urgent: bool = False, timer: bool = False) -> cf.Future[T]:
        """Run ``fn(*args)`` on the writer thread, after every job submitted before it
        (an ``urgent`` one: after those of its ``run`` and every job of no run).

        Args:
            run: the run the job reads or writes (None: it may touch any).
            urgent: run it ahead of the queued jobs of other runs.
            timer: a job of no run that urgent jobs may pass all the same: one a timer
                submits, whose moment is arbitrary (the sweep for runs whose server died).
        Raises:
            StoreBusy: too many jobs are already queued.
        """
        fut: cf.Future[T] = cf.Future()
        with self._ready:
            if len(self._lanes) >= self._lanes.size:
                raise StoreBusy("the server's storage is busy; retry later")
            self._lanes.put(_Job(fn, args, fut, run, run is None and not timer), urgent)
            self._ready.notify()
        return fut

    def stop(self, timeout: float = 30.0) -> None:
        """Run the jobs already queued, then stop both threads."""
        if self._thread is not None:
            with self._ready:
                self._stopping = True
                self._ready.notify()
            self._thread.join(timeout)
            self._thread = None
        self._stop_ckpt.set()
        if self._ckpt is not None:
            self._ckpt.join(timeout)
            self._ckpt = None

    def _next(self) -> _Job | None:
        """The next job; None once stopping and none is left."""
        with self._ready:
            while not self._lanes:
                if self._stopping:
                    return None
                self._ready.wait()
            return self._lanes.take()

    def _loop(self) -> None:
        while True:
            job = self._next()
            if job is None:
                return
            if not job.fut.set_running_or_notify_cancel():
                continue
            try:
                job.fut.set_result(job.fn(*job.args))
            except BaseException as e:  # handed to whoever awaits the job
                job.fut.set_exception(e)
