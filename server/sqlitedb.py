"""The SQLite backend: one ``gradwatch.db`` file (WAL mode) in the data directory.

The default :class:`~server.backend.Database`. Its schema is :mod:`server.db`'s, its
migrations :mod:`server.migrate`'s; its housekeeping copies the WAL into the database
(checkpoints) on a thread beside the writer so that the writer's commits stay short.
Plain module: no FastAPI.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from gradwatch.server import db
from gradwatch.server.migrate import open_current

log = logging.getLogger(__name__)


class SqliteDatabase:
    """The SQLite database of a data directory.

    Args:
        data_dir: the directory holding ``gradwatch.db`` (created if missing).
        checkpoint_every: seconds between passive WAL checkpoints.
    """

    kind = "sqlite"
    shared = False
    Error: type[Exception] = sqlite3.Error

    def __init__(self, data_dir: Path, checkpoint_every: float = 0.5):
        self.data_dir = data_dir
        self.where = str(data_dir / db.DB_NAME)
        self.checkpoint_every = checkpoint_every

    def open_writer(self) -> sqlite3.Connection:
        """The writing connection at the current schema (migrated first if older).

        Raises:
            NewerDatabase: the file was written by a newer gradwatch.
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        conn = open_current(self.data_dir)
        # Checkpoints copy the WAL into the database: the housekeeping thread does them,
        # so commits stay short.
        conn.execute("PRAGMA wal_autocheckpoint=0")
        return conn

    def close_writer(self, conn: sqlite3.Connection) -> None:
        """Fold the WAL into the file, then close."""
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except Exception:  # readers still open: fine, the WAL is replayed on open
            log.debug("final checkpoint failed", exc_info=True)
        conn.close()

    def open_reader(self) -> sqlite3.Connection:
        """A read-only connection (WAL lets it read beside the writer)."""
        return db.connect(self.data_dir, readonly=True)

    def generation(self, conn: sqlite3.Connection, run_id: str) -> int | None:
        """None: one server writes a data directory (its process holds the state)."""
        return None

    def lock_run(self, conn: sqlite3.Connection, run_id: str) -> int | None:
        """Nothing to do: SQLite has one writer (the writer thread); None (see
        :meth:`generation`)."""
        return None

    def bump(self, conn: sqlite3.Connection, run_id: str, generation: int,
             note: str) -> None:
        """Nothing to do (see :meth:`generation`): no other server reads this file."""

    def listen(self, heard: Callable[[str], None], stop: threading.Event) -> None:
        """Nothing to hear: returns at once."""

    def hold(self, conn: sqlite3.Connection, run_id: str) -> None:
        """Nothing to do: no other server writes this file."""

    def release(self, conn: sqlite3.Connection, run_id: str) -> None:
        """Nothing to do (see :meth:`hold`)."""

    def unheld(self, conn: sqlite3.Connection, run_ids: Sequence[str]) -> list[str]:
        """All of them: no other server holds a run of this file."""
        return list(run_ids)

    def housekeeping(self, stop: threading.Event) -> None:
        """Passive WAL checkpoints every ``checkpoint_every`` seconds until ``stop``."""
        conn = db.connect(self.data_dir)
        try:
            while not stop.wait(self.checkpoint_every):
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                except Exception:  # busy or I/O trouble: the next round retries
                    log.debug("checkpoint failed", exc_info=True)
        finally:
            with contextlib.suppress(sqlite3.Error):
                conn.close()
