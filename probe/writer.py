"""One writer thread: a bounded buffer of step facts and records in, step log lines (and a
streamer) out.

Thread: the writer thread, except :meth:`RecordWriter.put`, :meth:`~RecordWriter.put_blocking`
and :meth:`~RecordWriter.close`, the handover, called from the training thread.

The training thread only appends; when the buffer is full the item is dropped and counted
(reported in ``Stats`` and ``End``). The writer thread numbers records (``seq``), builds step
records from step facts (:mod:`gradwatch.probe.records`), writes them with
:class:`~gradwatch.steplog.StepLogWriter`, flushes each time it has drained the buffer (at
least every second), tells the streamer after each flush, and feeds a
:class:`~gradwatch.verdict.Verdict` so the verdict is ready at close. After each step record
it publishes that step's figures (:class:`StepFigures`) for the framework callbacks to read.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gradwatch.probe.records import Item, StepRecords
from gradwatch.steplog import StepLogWriter
from gradwatch.verdict import Verdict
from gradwatch.wire import Finding, Header, Stats, Step
from gradwatch.wirejson import dump_record

if TYPE_CHECKING:
    from gradwatch.stream import Streamer

log = logging.getLogger("gradwatch.probe")

_STATS_EVERY = 10.0
"""Seconds between ``Stats`` records while records are being dropped."""
_YIELD = 2e-5
"""Seconds the writer sleeps after each record, to hand the GIL back (see
:class:`RecordWriter`); the kernel rounds it up to its timer slack."""
_BEHIND = 256
"""Buffered records above which the writer stops yielding and catches up."""


@dataclass(frozen=True)
class StepFigures:
    """One optimizer's latest step as the writer thread wrote it: host floats, no tensors."""

    opt: str
    step: int
    """The step's index among the optimizer's steps."""
    norm: float | None
    """Norm of the accumulated gradient the step read (None: not sampled this step)."""
    fresh_norm: float | None
    """Norm of the contributions added since the previous step (None: not sampled)."""
    drift: float | None
    """``norm / fresh_norm``: 1.0 when every gradient was reset (None: not sampled)."""
    findings: int
    """Findings in the run (every optimizer, every kind) once this step was judged."""


class RecordWriter:
    """Owns the buffer, the thread and the step log file; wakes the streamer (which the
    :class:`~gradwatch.probe.api.WatchHandle` owns and closes) after each flush.

    :meth:`put` never blocks the training thread; the writer thread polls the buffer every
    ``poll`` seconds, writes what it finds and flushes, so the log is never more than
    ``poll`` seconds behind (the contract asks for at most one second).
    """

    # A bounded deque with no lock and no wake-up: a wake-up per record would cost a thread
    # switch per step. The writer sleeps a moment after each record: a drain in one go held
    # the GIL, and the training thread waited for all of it.

    def __init__(self, header: Header, path: Path | None, *, maxsize: int = 10_000,
                 poll: float = 0.1, streamer: Streamer | None = None,
                 warn_findings: bool = True) -> None:
        self.path = path
        self.maxsize = maxsize
        self.buffer: deque[Item | threading.Event] = deque()
        self.dropped = 0
        self.verdict = Verdict()
        self.streamer = streamer
        self.poll = poll
        self.warn_findings = warn_findings
        self._seq = 0
        self._records = StepRecords()
        self._found: set[tuple[str, str]] = set()
        self.latest: Mapping[str, StepFigures] = {}
        """Each optimizer's latest written step. The writer thread replaces the mapping
        whole, so a reader on another thread takes one attribute and never waits."""
        self._failed = False
        self._stop = threading.Event()
        self._file = StepLogWriter(path, flush_every=1.0) if path else None
        self._emit(header)
        self._flush()
        self._thread = threading.Thread(target=self._run, name="gradwatch-writer",
                                        daemon=True)
        self._thread.start()

    @property
    def written(self) -> int:
        """Records the writer thread has handled so far (written, or failed to write), the
        header included."""
        return self._seq

    def put(self, record: Item) -> None:
        """Buffer step facts or a record; never blocks (a full buffer drops and counts)."""
        if len(self.buffer) >= self.maxsize:
            self.dropped += 1
        else:
            self.buffer.append(record)

    def put_blocking(self, record: Item, timeout: float = 5.0) -> None:
        """Buffer a record, waiting up to ``timeout`` for room (close-time records)."""
        self._wait_for_room(timeout)
        self.put(record)

    def _wait_for_room(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while len(self.buffer) >= self.maxsize and time.monotonic() < deadline:
            time.sleep(0.01)
        return len(self.buffer) < self.maxsize

    def settle(self, timeout: float = 5.0) -> bool:
        """Wait until the writer thread has handled everything put before this call.

        For verdicts between notebook cells and at the end of a test, never for hooks:
        it waits up to ``poll`` seconds for the writer's next round. Returns False on
        timeout or when the thread has stopped.
        """
        if not self._thread.is_alive():
            return not self.buffer
        start = time.monotonic()
        if not self._wait_for_room(timeout):
            return False
        marker = threading.Event()
        self.buffer.append(marker)
        return marker.wait(max(0.0, timeout - (time.monotonic() - start)))

    def _run(self) -> None:
        last_stats, reported = time.monotonic(), 0
        while True:
            stopping = self._stop.wait(self.poll)
            wrote = False
            buffer = self.buffer
            while buffer:
                item = buffer.popleft()
                if isinstance(item, threading.Event):  # settle()'s marker
                    item.set()
                    continue
                self._emit(item)
                wrote = True
                if len(buffer) < _BEHIND and not self._stop.is_set():
                    time.sleep(_YIELD)  # hand the GIL back to the training thread
            now = time.monotonic()
            if self.dropped != reported and now - last_stats >= _STATS_EVERY:
                reported, last_stats = self.dropped, now
                self._emit(Stats(seq=0, t=time.time(), dropped=reported))
                wrote = True
            if wrote:
                self._flush()
            if stopping and not self.buffer:
                break

    def _emit(self, item: Item) -> None:
        try:
            rec = self._records.numbered(item, self._seq)
            self._seq += 1
            line = dump_record(rec)  # a step: wirejson.step_text, no walk over fields
            if self._file is not None:
                self._file.write(line)
            for f in self.verdict.feed(rec):
                self._new_finding(f)
            if isinstance(rec, Step):
                self._publish(rec)
        except Exception:  # noqa: BLE001 - the writer must outlive a bad record
            if not self._failed:
                self._failed = True
                log.exception("gradwatch: could not write a record to %s", self.path)

    def _publish(self, s: Step) -> None:
        figures = StepFigures(s.opt, s.step, s.norm, s.fresh_norm, s.drift, len(self._found))
        self.latest = {**self.latest, s.opt: figures}

    def _new_finding(self, f: Finding) -> None:
        key = (f.optimizer, f.kind)
        if key in self._found:
            return
        self._found.add(key)
        if not self.warn_findings:
            return
        log.warning("gradwatch: %s on %s from step %d: %s", f.kind, f.optimizer,
                    f.first_step, f.message)

    def _flush(self) -> None:
        try:
            if self._file is not None:
                self._file.flush()
        except OSError:
            if not self._failed:
                self._failed = True
                log.exception("gradwatch: could not flush %s", self.path)
        if self.streamer is not None:
            try:
                self.streamer.notify()
            except Exception:  # noqa: BLE001
                log.warning("gradwatch: streamer.notify failed; streaming stops",
                            exc_info=True)
                self.streamer = None

    def close(self, timeout: float = 10.0) -> None:
        """Write everything buffered, stop the thread, close the file."""
        if not self._thread.is_alive():
            return
        self._stop.set()
        self._thread.join(timeout)
        if self._file is not None:
            self._file.close()
