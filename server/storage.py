"""The storage writer: one thread owns the database connection that writes.

Routes hand work to it with :meth:`Store.submit` (a :class:`concurrent.futures.Future` the
event loop can await), so SQLite never blocks the event loop and every ingest batch is one
transaction: a batch is stored whole or not at all. Records are stored once by
(run, rank, seq); a resend is ignored record by record. Plain module: no FastAPI.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import queue
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from gradwatch.frames import OptimizerView, RunSummary
from gradwatch.server import db
from gradwatch.server.digest import Digest, digest, digest_records
from gradwatch.server.runstate import RunState, load_state, new_state
from gradwatch.server.series import Row
from gradwatch.server.writes import write_records
from gradwatch.wire import Finding, Header, IngestBatch, parse_record

log = logging.getLogger(__name__)
T = TypeVar("T")


class IngestError(Exception):
    """A batch that must be refused; ``code`` is the websocket close code to answer."""

    def __init__(self, code: int, reason: str):
        super().__init__(reason)
        self.code = code
        self.reason = reason


class StoreBusy(Exception):
    """The writer's queue is full: the caller should back off."""


@dataclass
class IngestResult:
    """What one stored batch changed, for the ack and the live fan-out."""

    run: str
    rank: int
    ack: int
    new_run: bool = False
    stored: int = 0
    rows: list[Row] = field(default_factory=list)
    optimizers: list[OptimizerView] = field(default_factory=list)
    findings: list[Finding] | None = None
    summary: RunSummary | None = None


class Store:
    """The data directory's database, written by one thread.

    Args:
        data_dir: directory holding ``gradwatch.db`` (created if missing).
        max_runs: refuse to create runs beyond this many.
        queue_size: pending write jobs before :meth:`submit` raises :class:`StoreBusy`.
    """

    def __init__(self, data_dir: Path, max_runs: int = 1000, queue_size: int = 256):
        self.data_dir = data_dir
        self.max_runs = max_runs
        self._jobs: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
        self._states: OrderedDict[str, RunState] = OrderedDict()
        self._thread: threading.Thread | None = None
        data_dir.mkdir(parents=True, exist_ok=True)
        self._conn = db.connect(data_dir)
        # Checkpoints copy the WAL into the database; a helper thread does them so commits
        # on the writer stay short (SQLite releases the GIL while it works).
        self._conn.execute("PRAGMA wal_autocheckpoint=0")
        self._stop_ckpt = threading.Event()
        self._ckpt: threading.Thread | None = None
        # A run that was live when the server stopped lost its stream: interrupted until
        # its probe reconnects and resumes.
        n = self._conn.execute(
            "UPDATE runs SET status='interrupted' WHERE status='live'").rowcount
        if n:
            log.info("marked %d run(s) that were live at shutdown as interrupted", n)

    # -- thread plumbing -------------------------------------------------------------
    def start(self) -> None:
        """Start the writer thread."""
        self._thread = threading.Thread(target=self._loop, name="gradwatch-store",
                                        daemon=True)
        self._thread.start()
        self._ckpt = threading.Thread(target=self._checkpoints, name="gradwatch-checkpoint",
                                      daemon=True)
        self._ckpt.start()

    def _checkpoints(self, every: float = 0.5) -> None:
        conn = db.connect(self.data_dir)
        try:
            while not self._stop_ckpt.wait(every):
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                except Exception:  # busy or I/O trouble: the next round retries
                    log.debug("checkpoint failed", exc_info=True)
        finally:
            conn.close()

    def close(self, timeout: float = 30.0) -> None:
        """Finish queued writes, then stop the thread and close the database."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join(timeout)
            self._thread = None
        self._stop_ckpt.set()
        if self._ckpt is not None:
            self._ckpt.join(timeout)
            self._ckpt = None
        try:
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except Exception:  # readers still open: fine, the WAL is replayed on open
            log.debug("final checkpoint failed", exc_info=True)
        self._conn.close()

    def submit(self, fn: Callable[..., T], *args: Any) -> cf.Future[T]:
        """Run ``fn(*args)`` on the writer thread.

        Raises:
            StoreBusy: too many writes are already queued.
        """
        fut: cf.Future[T] = cf.Future()
        try:
            self._jobs.put_nowait((fn, args, fut))
        except queue.Full:
            raise StoreBusy("the server's storage is busy; retry later") from None
        return fut

    def call(self, fn: Callable[..., T], *args: Any, timeout: float = 60.0) -> T:
        """Run ``fn(*args)`` on the writer thread and wait for its result."""
        return self.submit(fn, *args).result(timeout)

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
            except BaseException as e:  # handed to the awaiting route
                fut.set_exception(e)

    # -- writer-thread operations (call through submit/call) --------------------------
    def _state(self, run_id: str) -> RunState | None:
        st = self._states.get(run_id)
        if st is None:
            st = load_state(self._conn, run_id)
            if st is None:
                return None
            self._states[run_id] = st
            while len(self._states) > 64:
                self._states.popitem(last=False)
        self._states.move_to_end(run_id)
        return st

    def ingest(self, batch: IngestBatch | Digest, name: str | None = None) -> IngestResult:
        """Store one batch (whole or not at all) and report what changed.

        Raises:
            IngestError: the batch breaks the stream rules or a limit.
        """
        d = batch if isinstance(batch, Digest) else digest(batch)
        items = d.items
        prev = -1
        header: Header | None = None
        for it in items:
            if it.seq <= prev:
                raise IngestError(1007, f"records must be in increasing seq order "
                                        f"(seq {it.seq} after {prev})")
            prev = it.seq
            if it.kind == "header":
                header = parse_record(it.body)
                if it.seq != 0 or header.run != d.run or header.rank != d.rank:
                    raise IngestError(1007, "a header must have seq 0 and the batch's run "
                                            "and rank")
        st = self._state(d.run)
        starts = bool(items) and items[0].kind == "header"
        if (st is None or d.rank not in st.max_seq) and not starts:
            if not items:
                return IngestResult(d.run, d.rank, -1)
            raise IngestError(1007, f"unknown stream {d.run}/{d.rank}: its first "
                                    f"batch must start with its header (seq 0)")
        if st is None:
            n = self._conn.execute("SELECT count(*) FROM runs").fetchone()[0]
            if n >= self.max_runs:
                raise IngestError(1008, f"run limit reached ({self.max_runs} runs); "
                                        f"delete runs to make room")
        res = IngestResult(d.run, d.rank, -1)
        self._conn.execute("BEGIN")
        try:
            if st is None:
                assert header is not None  # checked above
                st = self._create(header, name)
                res.new_run = True
            write_records(self._conn, st, d.rank, items, res)
            self._conn.execute("COMMIT")
        except BaseException:
            self._conn.execute("ROLLBACK")
            self._states.pop(d.run, None)  # its verdict saw rolled-back records
            raise
        res.ack = st.max_seq.get(d.rank, -1)
        res.summary = st.summary()
        return res

    def _create(self, header: Header, name: str | None) -> RunState:
        cur = self._conn.execute(
            "INSERT INTO runs(id, name, status, started, updated, torch_version, "
            "world_size, header) VALUES(?,?,?,?,?,?,?,?)",
            (header.run, name or header.run_name or header.run, "live", header.started,
             header.t, header.torch_version, header.world_size,
             header.model_dump_json(exclude_none=True)))
        assert cur.lastrowid is not None
        st = new_state(cur.lastrowid, header, name)
        self._states[header.run] = st
        return st

    def resume_seq(self, run_id: str, rank: int) -> int:
        """Highest stored seq of a stream, -1 if none."""
        st = self._state(run_id)
        return -1 if st is None else st.max_seq.get(rank, -1)

    def mark_interrupted(self, run_id: str) -> RunSummary | None:
        """A live run whose stream dropped without End: mark it interrupted."""
        st = self._state(run_id)
        if st is None or st.status != "live":
            return None
        st.status = "interrupted"
        self._conn.execute("UPDATE runs SET status='interrupted' WHERE rid=?", (st.rid,))
        return st.summary()

    def delete(self, run_id: str) -> bool:
        """Delete a run and everything stored for it; ``False`` if there is none."""
        st = self._state(run_id)
        if st is None:
            return False
        self._conn.execute("BEGIN")
        for table in db.RUN_TABLES:
            self._conn.execute(f"DELETE FROM {table} WHERE rid=?", (st.rid,))
        self._conn.execute("COMMIT")
        self._states.pop(run_id, None)
        return True

    def free_id(self, wanted: str) -> str:
        """``wanted`` if no run has that id, else ``wanted-2``, ``wanted-3``, ..."""
        base, n, cand = wanted[:56], 1, wanted
        while self._conn.execute("SELECT 1 FROM runs WHERE id=?", (cand,)).fetchone():
            n += 1
            cand = f"{base}-{n}"
        return cand

    def import_log(self, header: Header, records: list[Any],
                   name: str | None = None) -> tuple[str, int]:
        """Store a whole step log as a new run (a fresh id if the log's is taken).

        Returns:
            The run id and the number of step records stored.
        Raises:
            IngestError: the run limit is reached.
        """
        run_id = self.free_id(header.run)
        header = header.model_copy(update={"run": run_id})
        recs: list[Any] = [header, *records]
        steps = 0
        for i in range(0, len(recs), 5000):
            res = self.ingest(digest_records(run_id, header.rank, recs[i:i + 5000]), name)
            steps += len(res.rows)
        st = self._state(run_id)
        if st is not None and st.status == "live":
            st.status = st.final_status() or "interrupted"
            self._conn.execute("UPDATE runs SET status=? WHERE rid=?", (st.status, st.rid))
        return run_id, steps
