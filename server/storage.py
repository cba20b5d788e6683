"""The storage writer: one thread owns the database connection that writes.

:class:`Store` is the :class:`~server.backend.Storage` interface over either database
(:mod:`server.sqlitedb`, :mod:`server.pgdb`). Routes hand work to it with
:meth:`Store.submit` (a :class:`concurrent.futures.Future` the event loop can await; the
threads are :mod:`server.writerthread`'s), so the database never blocks the event loop,
and every ingest batch is one transaction: a batch is stored whole or not at all. A step
is stored once per (series, step), other records once by (run, rank, seq); a resend is
ignored record by record. A write the database refuses (full, I/O error) is rolled back
and the run's in-memory state dropped, so memory and database agree and the stream
resends from what is stored. Refusals are the domain errors of :mod:`server.errors`.
The runs' cached states (kept current when other servers write the database too) are
:mod:`server.runcache`'s; new runs' names and ids :mod:`server.runnames`'. Plain module:
no FastAPI.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import json
import logging
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from gradwatch.frames import RunSummary
from gradwatch.server import db, owners
from gradwatch.server.backend import Database, open_database
from gradwatch.server.batch import Batch, Entry, IngestResult, batch_of_records
from gradwatch.server.errors import (
    InvalidStream,
    NameTaken,
    RunLimitReached,
    RunLive,
    StorageFailed,
)
from gradwatch.server.reader import Reader
from gradwatch.server.runcache import RunCache
from gradwatch.server.runnames import distinct_name, free_id, name_taken
from gradwatch.server.runstate import RunState, new_state
from gradwatch.server.writerthread import WriterThread
from gradwatch.server.writes import ResetSets, write_batch
from gradwatch.wire import Header

log = logging.getLogger(__name__)
T = TypeVar("T")


class Store:
    """A database, written by one thread; its reads through :attr:`reader`.

    Args:
        where: a data directory (SQLite's ``gradwatch.db``, created if missing), a
            ``postgresql://`` URL, or a :class:`~server.backend.Database`.
        max_runs: refuse to create runs beyond this many.
        queue_size: pending write jobs before :meth:`submit` raises :class:`StoreBusy`.
        keep_param_norms: runs created from now on keep the per-parameter norms of every
            N-th step (and of every step a plot must keep: :func:`server.rows.must_keep`).

    Raises:
        NewerDatabase: the database was written by a newer gradwatch.
        UnknownDatabase: ``where`` names no database gradwatch can use.
    """

    def __init__(self, where: Path | str | Database, max_runs: int = 1000,
                 queue_size: int = 256, keep_param_norms: int = 1):
        self.database = open_database(where)
        self.max_runs = max_runs
        self.keep_param_norms = max(1, keep_param_norms)
        self._resets = ResetSets()
        self._error = self.database.Error
        self._conn = self.database.open_writer()
        self._writer = WriterThread(self.database.housekeeping, queue_size)
        self.reader = Reader(self.database)
        self.server = uuid.uuid4().hex[:12]
        """This server's id among those sharing the database."""
        self._runs = RunCache(self.database, self._conn, self.server, self.keep_param_norms)
        self._runs.interrupt_unheld()
        self._unheld: set[str] = set()  # live runs no server held at the last sweep

    # -- thread plumbing -------------------------------------------------------------
    def start(self) -> None:
        """Start the writer thread."""
        self._writer.start()

    def close(self, timeout: float = 30.0) -> None:
        """Finish queued writes, then stop the threads and close the database."""
        self._writer.stop(timeout)
        self.database.close_writer(self._conn)
        self.reader.close()

    def submit(self, fn: Callable[..., T], *args: Any, run: str | None = None,
               urgent: bool = False, timer: bool = False) -> cf.Future[T]:
        """Run ``fn(*args)`` on the writer thread, after the jobs submitted before it (an
        ``urgent`` job of a ``run``: after those of the run, :mod:`server.writerthread`).

        Args:
            run: the one run ``fn`` reads or writes (None: any).
            urgent: go ahead of other runs' queued jobs (a live client's small batch).
            timer: a job of no run that urgent ones may pass (its moment is arbitrary).
        Raises:
            StoreBusy: too many writes are already queued.
        """
        return self._writer.submit(fn, *args, run=run, urgent=urgent, timer=timer)

    def call(self, fn: Callable[..., T], *args: Any, timeout: float = 60.0) -> T:
        """Run ``fn(*args)`` on the writer thread and wait for its result."""
        return self.submit(fn, *args).result(timeout)

    # -- writer-thread operations (call through submit/call) --------------------------
    def _state(self, run_id: str) -> RunState | None:
        """The run's state, current with the database (:class:`RunCache`)."""
        try:
            return self._runs.get(run_id)
        except self._error as e:  # the database is gone (restarting): refused, resent later
            self._rolled_back(run_id)
            raise StorageFailed(f"the server could not read its database ({e}); nothing "
                                f"was stored: resend once it is back") from e

    def _check(self, st: RunState | None, batch: Batch, key: str | None) -> bool:
        """Refuse a batch the stream rules do not allow; False: nothing to store.

        Raises:
            InvalidStream, StreamOwned, RunLimitReached: as :meth:`ingest`.
        """
        owners.check(st, batch.rank, key)
        entries = batch.entries
        starts = bool(entries) and entries[0].kind == "header"
        if (st is None or batch.rank not in st.max_seq) and not starts:
            if not entries:
                return False
            raise InvalidStream(f"unknown stream {batch.run}/{batch.rank}: its first batch "
                                f"must start with its header (seq 0)")
        if st is None:
            n = self._conn.execute("SELECT count(*) FROM runs").fetchone()[0]
            if n >= self.max_runs:
                raise RunLimitReached(f"run limit reached ({self.max_runs} runs); delete "
                                      f"runs to make room")
        return True

    def ingest(self, batch: Batch, name: str | None = None,
               key: str | None = None) -> IngestResult:
        """Store one batch (whole or not at all) and report what changed.

        Args:
            name: the display name of a run this batch creates (default: the header's).
            key: the stream key the sending connection presented (:mod:`server.owners`);
                a batch that starts the stream makes it that key's.
        Raises:
            InvalidStream: the batch breaks the stream rules (nothing stored).
            StreamOwned: another key owns the stream (nothing stored).
            RunLimitReached: the batch would create a run beyond ``max_runs``.
            StorageFailed: the disk refused the write (nothing of the batch stored;
                everything stored before stays readable).
        """
        entries = batch.entries
        prev = -1
        header: Entry | None = None
        for e in entries:
            if e.seq <= prev:
                raise InvalidStream(f"records must be in increasing seq order "
                                    f"(seq {e.seq} after {prev})")
            prev = e.seq
            if e.kind == "header":
                header, h = e, e.record
                assert isinstance(h, Header)
                if e.seq != 0 or h.run != batch.run or h.rank != batch.rank:
                    raise InvalidStream("a header must have seq 0 and the batch's run and "
                                        "rank")
        shared = self.database.shared
        st = None
        if not shared:  # one writer: the cached state is the database's
            st = self._state(batch.run)
            if not self._check(st, batch, key):
                return IngestResult(batch.run, batch.rank, -1)
        res = IngestResult(batch.run, batch.rank, -1)
        try:
            self._conn.execute("BEGIN")
            if shared:
                # Servers sharing the database take turns at a run; under its lock the
                # run's generation says whether another wrote it since this server's
                # state: then the state is rebuilt and the checks made on it. (Read here
                # only, with the lock: a batch waits for the database once before its
                # COMMIT.)
                st = self._runs.at(batch.run, self.database.lock_run(self._conn, batch.run))
                if not self._check(st, batch, key):
                    self._conn.execute("ROLLBACK")
                    return IngestResult(batch.run, batch.rank, -1)
                # This server takes the run's stream: no other marks it interrupted
                # meanwhile (after the checks: a refused batch takes nothing).
                self.database.hold(self._conn, batch.run)
            if st is None:
                assert header is not None  # a stream's first batch starts with it: above
                st = self._create(header, name)
                res.new_run = True
            owners.claim(st, batch.rank, key)
            if write_batch(self._conn, st, batch, res, self._resets):
                self._runs.wrote(st, res)
            self._conn.execute("COMMIT")
        except BaseException as e:
            self._rolled_back(batch.run)
            if isinstance(e, self._error):
                log.error("storing a batch of run %s failed: %s", batch.run, e)
                raise StorageFailed(f"the server could not store this batch ({e}); "
                                    f"nothing of it was stored: resend it once the "
                                    f"server's disk has room") from e
            raise
        if st.status != "live":  # ended: nothing more to take (a lost connection lost it)
            with contextlib.suppress(self._error):
                self.database.release(self._conn, batch.run)
        res.ack = st.acked.get(batch.rank, -1)
        res.summary = st.summary()
        return res

    def _rolled_back(self, run_id: str) -> None:
        """Undo a failed transaction; memory forgets what it did (SQLite may already have
        rolled it back itself: a full disk does)."""
        if self._conn.in_transaction:
            with contextlib.suppress(self._error):
                self._conn.execute("ROLLBACK")
        self._runs.forget(run_id)  # its counters and verdict saw rolled-back records
        self._resets.clear()  # ids of reset sets the transaction added

    def _create(self, entry: Entry, name: str | None) -> RunState:
        header = entry.record
        assert isinstance(header, Header)
        name = distinct_name(self._conn, name or header.run_name or header.run)
        cur = self._conn.execute(
            "INSERT INTO runs(id, name, status, started, updated, torch_version, "
            "world_size, header, notes, tags) VALUES(?,?,?,?,?,?,?,?,?,?)",
            (header.run, name, "live", header.started,
             header.t, header.torch_version, header.world_size, entry.body, header.notes,
             json.dumps(header.tags)))
        assert cur.lastrowid is not None
        st = new_state(cur.lastrowid, header, name, self.keep_param_norms)
        st.gen = self.database.generation(self._conn, header.run) or 0  # a re-created id
        self._runs.add(st)
        return st

    def resume_seq(self, run_id: str, rank: int, key: str | None = None) -> int:
        """The ack of a stream (every record up to it is stored), -1 if none.

        Raises:
            StreamOwned: another key owns the stream.
        """
        st = self._state(run_id)
        owners.check(st, rank, key)
        return -1 if st is None else st.acked.get(rank, -1)

    def owns(self, run_id: str, rank: int, key: str | None) -> bool:
        """Whether ``key`` owns the stored stream (``run_id``, ``rank``)."""
        return owners.holds(self._state(run_id), rank, key)

    def mark_interrupted(self, run_id: str) -> RunSummary | None:
        """The run's stream to this server dropped (without End, or after it): let go of
        the run, and mark it interrupted if it is live and no other server holds it (a
        probe that moved to another server goes on there). The new summary, or None."""
        try:
            self._conn.execute("BEGIN")
            self.database.release(self._conn, run_id)
            st = self._state(run_id)
            if st is None or st.status != "live" or not self.database.unheld(
                    self._conn, [run_id]):
                self._conn.execute("ROLLBACK")
                return None
            self._conn.execute("UPDATE runs SET status='interrupted' WHERE rid=?", (st.rid,))
            self._runs.wrote(st)
            self._conn.execute("COMMIT")
        except self._error as e:  # a full disk: the run stays live until a write succeeds
            self._rolled_back(run_id)
            log.error("marking run %s interrupted failed: %s", run_id, e)
            return None
        st.status = "interrupted"
        return st.summary()

    def sweep(self) -> list[str]:
        """Live runs that no server has held since the last sweep (the server that took
        their stream died, and their probe has not come back): mark them interrupted. A
        run found unheld once waits a sweep, so a probe moving to another server is not
        caught between the two. The runs marked (their summaries changed).
        """
        try:
            marked, self._unheld = self._runs.interrupt_unheld(
                self._unheld, "lost their server")
        except self._error as e:  # rolled back; tried again at the next sweep
            log.warning("looking for runs whose server went away failed: %s", e)
            return []
        for run in marked:
            self._runs.forget(run)
        return marked

    def delete(self, run_id: str) -> bool:
        """Delete a run and everything stored for it; ``False`` if there is none.

        Raises:
            RunLive: a keyed stream still writes the run (status ``live``). Deleted, its id
                would be free for anyone to re-create under another key, and its own probe
                refused (4403) from then on.
            StorageFailed: the disk refused the write.
        """
        st = self._state(run_id)
        if st is None:
            return False
        if st.status == "live" and st.keys:
            raise RunLive(f"run {run_id} is live: it can be deleted once it has ended (or "
                          f"reads as interrupted, its stream gone)")
        try:
            self._conn.execute("BEGIN")
            self.database.release(self._conn, run_id)
            db.delete_run(self._conn, st.rid)
            self._runs.wrote(st, deleted=True)
            self._conn.execute("COMMIT")
        except self._error as e:
            self._rolled_back(run_id)
            raise StorageFailed(f"the server could not delete run {run_id} ({e})") from e
        self._runs.forget(run_id)
        return True

    def rename(self, run_id: str, name: str) -> RunSummary | None:
        """Give a run a new display name; ``None`` if there is no such run.

        Raises:
            NameTaken: another run has that name.
            StorageFailed: the disk refused the write (the name is unchanged).
        """
        st = self._state(run_id)
        if st is None:
            return None
        if name != st.name and name_taken(self._conn, name):
            raise NameTaken(f"another run is already named '{name}'; pick another name")
        try:
            self._conn.execute("UPDATE runs SET name=? WHERE rid=?", (name, st.rid))
            self._runs.wrote(st)
        except self._error as e:
            raise StorageFailed(f"the server could not rename run {run_id} ({e})") from e
        st.name = name
        return st.summary()

    def annotate(self, run_id: str, notes: str | None, tags: list[str] | None
                 ) -> RunSummary | None:
        """Set a run's notes and/or tags (None: left as they are); ``None`` if there is no
        such run.

        Raises:
            StorageFailed: the disk refused the write (nothing changed).
        """
        st = self._state(run_id)
        if st is None:
            return None
        notes = st.notes if notes is None else notes
        tags = st.tags if tags is None else tags
        try:
            self._conn.execute("UPDATE runs SET notes=?, tags=? WHERE rid=?",
                               (notes, json.dumps(tags), st.rid))
            self._runs.wrote(st)
        except self._error as e:
            raise StorageFailed(f"the server could not save the notes of run {run_id} "
                                f"({e})") from e
        st.notes, st.tags = notes, list(tags)
        return st.summary()

    def import_start(self, header: Header, name: str | None = None) -> str:
        """Create the run of an imported step log from its header (a fresh id if the log's
        is taken); its records follow through :meth:`ingest`.

        Raises:
            RunLimitReached: the server holds ``max_runs`` runs already.
        """
        run_id = free_id(self._conn, header.run)
        header = header.model_copy(update={"run": run_id})
        self.ingest(batch_of_records(run_id, header.rank, [header]), name)
        return run_id

    def import_end(self, run_id: str) -> None:
        """An imported log is stored whole: the run ends (interrupted without an End)."""
        st = self._state(run_id)
        if st is not None and st.status == "live":
            st.status = st.final_status() or "interrupted"
            self._conn.execute("UPDATE runs SET status=? WHERE rid=?", (st.status, st.rid))
            self._runs.wrote(st)
        with contextlib.suppress(self._error):  # stored whole already: a lost hold is gone
            self.database.release(self._conn, run_id)
