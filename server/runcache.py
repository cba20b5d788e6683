"""The writer's run states, kept equal to the database when other servers write it too.

:class:`RunCache` owns the :class:`~server.runstate.RunState` of the runs the writer
touched last (acks, key hashes, counters, the Verdict), each stamped with the run's write
generation. On a shared database (PostgreSQL) a state whose generation another server has
moved on is rebuilt from storage before use; every write of a run bumps the generation and
announces the change to the other servers (:mod:`server.remote`), in the write's
transaction. It also marks the live runs whose stream no server takes
(:meth:`RunCache.interrupt_unheld`). Runs on the writer thread: only
:class:`server.storage.Store` uses it. Plain module: no FastAPI.
"""

from __future__ import annotations

import contextlib
import logging
from collections import OrderedDict
from collections.abc import Container

from gradwatch.server.backend import Conn, Database
from gradwatch.server.batch import IngestResult
from gradwatch.server.remote import note_of
from gradwatch.server.runstate import RunState, load_state

log = logging.getLogger(__name__)

CACHED = 64
"""Run states kept (the most recently used)."""


class RunCache:
    """Run states on the writer's connection (see module doc).

    Args:
        database: the database (its generations, notes and holds).
        conn: the writer's connection.
        server: this server's id (its notes' sender).
        keep_param_norms: what a run's rebuilt state keeps (:func:`load_state`).
    """

    def __init__(self, database: Database, conn: Conn, server: str, keep_param_norms: int):
        self.database, self.conn, self.server = database, conn, server
        self.keep_param_norms = keep_param_norms
        self._states: OrderedDict[str, RunState] = OrderedDict()

    def get(self, run_id: str) -> RunState | None:
        """The run's state: cached, or rebuilt from the database when there is none or
        another server has written the run since (its write generation moved on).

        Raises:
            database.Error: the database could not be read.
        """
        return self.at(run_id, self.database.generation(self.conn, run_id))

    def at(self, run_id: str, gen: int | None) -> RunState | None:
        """As :meth:`get`, the run's write generation read already (``gen``; None where
        one server writes)."""
        st = self._states.get(run_id)
        if st is not None and gen is not None and st.gen != gen:
            log.info("run %s was written by another server: state rebuilt", run_id)
            st = None
        if st is None:
            st = load_state(self.conn, run_id, self.keep_param_norms)
        if st is None:
            self._states.pop(run_id, None)
            return None
        if self._states.get(run_id) is not st:
            st.gen = gen or 0
            self.add(st)
        self._states.move_to_end(run_id)
        return st

    def add(self, st: RunState) -> None:
        """Keep a run's state (a new run's, or one rebuilt), the oldest let go."""
        self._states[st.id] = st
        self._states.move_to_end(st.id)
        while len(self._states) > CACHED:
            self._states.popitem(last=False)

    def forget(self, run_id: str) -> None:
        """Drop a state that no longer matches the database (a rolled-back write, a
        deleted run)."""
        self._states.pop(run_id, None)

    def wrote(self, st: RunState, res: IngestResult | None = None,
              deleted: bool = False) -> None:
        """A write of the run is about to commit: the next generation is this state's,
        and the other servers on the database hear of it."""
        if self.database.shared:
            st.gen += 1
            self._bump(st.id, st.gen, res, deleted)

    def _bump(self, run_id: str, gen: int, res: IngestResult | None = None,
              deleted: bool = False) -> None:
        """Store the run's new write generation and tell the other servers."""
        self.database.bump(self.conn, run_id, gen,
                           note_of(self.server, run_id, res, deleted))

    def interrupt_unheld(self, among: Container[str] | None = None,
                         why: str = "were live at shutdown") -> tuple[list[str], set[str]]:
        """A live run whose stream no server takes lost it: interrupted until its probe
        reconnects and resumes. At a server's start, every live run (on a shared database:
        those no other server holds, the others are being written, :mod:`server.pgholds`).

        Args:
            among: mark only these of the unheld runs (runs seen unheld before).
            why: what the log line says of the runs marked.
        Returns:
            The runs marked, and every live run found unheld.
        Raises:
            database.Error: the database refused (nothing marked).
        """
        conn = self.conn
        conn.execute("BEGIN")
        try:
            live = [r[0] for r in conn.execute(
                "SELECT id FROM runs WHERE status='live' ORDER BY id").fetchall()]
            unheld = self.database.unheld(conn, live)
            lost = [r for r in unheld if among is None or r in among]
            conn.executemany("UPDATE runs SET status='interrupted' WHERE id=?",
                             [(run,) for run in lost])
            if self.database.shared:  # other servers' cached states and dashboards
                for run in lost:
                    self._bump(run, (self.database.generation(conn, run) or 0) + 1)
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(self.database.Error):
                conn.execute("ROLLBACK")
            raise
        if lost:
            log.info("marked %d run(s) that %s as interrupted%s", len(lost), why,
                     f" ({len(live) - len(unheld)} held by servers)"
                     if len(unheld) < len(live) else "")
        return lost, set(unheld)
