"""One writer thread: a bounded queue of records in, step log lines (and a streamer) out.

The training thread only ``put_nowait``s; when the queue is full the record is dropped and
counted (reported in ``Stats`` and ``End``). The writer thread numbers records (``seq``),
copies sampled norms to the host, writes them with :class:`~gradwatch.steplog.StepLogWriter`,
flushes when the queue drains and at least every second, tells the streamer after each
flush, and feeds a :class:`~gradwatch.analysis.Judge` so the verdict is ready at close.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from pathlib import Path
from typing import Any

from gradwatch.probe.judge import PendingStep

from gradwatch.analysis import Judge
from gradwatch.steplog import StepLogWriter
from gradwatch.wire import Finding, Header, dump_record

log = logging.getLogger("gradwatch.probe")

_STOP = object()


class RecordWriter:
    """Owns the queue, the thread, the step log file and the streamer."""

    def __init__(self, header: Header, path: Path | None, *, maxsize: int = 10_000,
                 flush_every: float = 1.0, streamer: Any = None,
                 warn_findings: bool = True) -> None:
        self.path = path
        self.queue: queue.Queue[Any] = queue.Queue(maxsize=maxsize)
        self.dropped = 0
        self.written = 0
        self.judge = Judge()
        self.streamer = streamer
        self.flush_every = flush_every
        self.warn_findings = warn_findings
        self._seq = 0
        self._warned: set[tuple[str, str]] = set()
        self._failed = False
        self._file = StepLogWriter(path, flush_every=flush_every) if path else None
        self._emit(header)
        self._flush()
        self._thread = threading.Thread(target=self._run, name="gradwatch-writer",
                                        daemon=True)
        self._thread.start()

    def put(self, record: Any) -> None:
        """Enqueue a record; never blocks (a full queue drops and counts)."""
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            self.dropped += 1

    def put_blocking(self, record: Any, timeout: float = 5.0) -> None:
        try:
            self.queue.put(record, timeout=timeout)
        except queue.Full:
            self.dropped += 1

    def _run(self) -> None:
        dirty = False
        last = time.monotonic()
        while True:
            try:
                item = self.queue.get(timeout=self.flush_every)
            except queue.Empty:
                if dirty:
                    self._flush()
                    dirty = False
                continue
            if item is _STOP:
                break
            self._emit(item)
            dirty = True
            now = time.monotonic()
            if self.queue.empty() or now - last >= self.flush_every:
                self._flush()
                dirty = False
                last = now
        self._flush()

    def _emit(self, item: Any) -> None:
        try:
            rec = item.to_record(self._seq) if isinstance(item, PendingStep) else item
            rec.seq = self._seq
            self._seq += 1
            line = dump_record(rec)
            if self._file is not None:
                self._file.write(line)
            self.written += 1
            for f in self.judge.feed(rec):
                self._new_finding(f)
        except Exception:  # noqa: BLE001 - the writer must outlive a bad record
            if not self._failed:
                self._failed = True
                log.exception("gradwatch: could not write a record to %s", self.path)

    def _new_finding(self, f: Finding) -> None:
        key = (f.optimizer, f.kind)
        if key in self._warned or not self.warn_findings:
            return
        self._warned.add(key)
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
        """Write everything queued, stop the thread, close the file."""
        if not self._thread.is_alive():
            return
        with contextlib.suppress(queue.Full):
            self.queue.put(_STOP, timeout=timeout)
        self._thread.join(timeout)
        if self._file is not None:
            self._file.close()
