"""The PostgreSQL backend: psycopg 3 connections that speak the storage modules' SQL.

:class:`PostgresDatabase` is the :class:`~server.backend.Database` of a ``postgresql://``
URL. Its connections (:class:`PgConn`) take the statements the storage modules write for
SQLite and run them in PostgreSQL's form (:func:`pg_sql`): ``%s`` placeholders, upserts for
``INSERT OR IGNORE`` / ``INSERT OR REPLACE``, ``RETURNING`` for the ids SQLite gives as
``lastrowid``, snapshot reads for a reader's ``BEGIN``, and the few statements whose
meaning needs other words (:data:`REWRITES`), and over the packed steps of schema 6
(:func:`server.pgpack.packed_form`). A connection that broke (the database
restarted) is opened again on its next statement; the statement that saw it break fails
as the engine's error, so the batch is refused and resent. Imports psycopg: only
:func:`server.backend.open_database` imports this module, for a PostgreSQL URL.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import lru_cache
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from gradwatch.server import pgpack, pgschema
from gradwatch.server.backend import masked, password_of
from gradwatch.server.pgheld import HeldRows, touches
from gradwatch.server.pgholds import RunHolds
from gradwatch.server.series_read import BUCKET_MAX

log = logging.getLogger(__name__)

CHANNEL = "gradwatch"
"""The NOTIFY channel of :mod:`server.remote`'s notes."""
VACUUM_EVERY = 0.02
"""Seconds between vacuums of the open chunks' tables while chunks are being packed."""
_IDS = {"runs": "rid", "series": "sid", "reset_sets": "id"}
"""Tables whose new row's id the writer reads (SQLite's ``lastrowid``)."""

REWRITES = {
    "SELECT id FROM reset_sets WHERE body=?":
        # through the digest index; comparing the bodies too keeps a collision apart
        "SELECT r.id FROM (SELECT %s::text AS b) q JOIN reset_sets r "
        "ON md5(r.body) = md5(q.b) AND r.body = q.b",
    BUCKET_MAX:
        # PostgreSQL has no bare columns beside max(): the first step of the largest norm
        "SELECT DISTINCT ON (k) k, step, v FROM (SELECT step / %s AS k, step, "
        "coalesce(norm, -1) AS v FROM gw_steps_in(%s, %s, %s) r) q "
        "ORDER BY k, v DESC, step",
}
"""Statements whose PostgreSQL form is not a mechanical translation (:func:`pg_sql`)."""


@lru_cache(maxsize=2048)
def pg_sql(sql: str, reader: bool = False) -> tuple[str, str | None]:
    """A storage statement in PostgreSQL's form, and the id column it returns (or None).

    Args:
        reader: on a reader's connection, ``BEGIN`` starts a read-only snapshot (SQLite's
            read transaction sees one state of the file; PostgreSQL's default, one per
            statement).
    """
    if sql in REWRITES:
        return REWRITES[sql], None
    s = pgpack.packed_form(sql.strip())
    if s == "BEGIN":
        return ("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY" if reader else s), None
    s = s.replace("%", "%%").replace("?", "%s")
    returning = None
    if s.startswith("INSERT OR IGNORE INTO "):
        s = "INSERT INTO " + s[len("INSERT OR IGNORE INTO "):] + " ON CONFLICT DO NOTHING"
    elif s.startswith("INSERT OR REPLACE INTO "):
        s = "INSERT INTO " + s[len("INSERT OR REPLACE INTO "):]
        table = s.split()[2].split("(")[0]
        keys = pgschema.KEYS[table]
        s += f" ON CONFLICT ({', '.join(keys)}) DO UPDATE SET " + "{updates}"
        returning = f"upsert:{table}"
    elif s.startswith("INSERT INTO "):
        table = s.split()[2].split("(")[0]
        if table in _IDS and "RETURNING" not in s:
            returning = _IDS[table]
            s += f" RETURNING {returning}"
    return s, returning


class _Cursor:
    """A statement's outcome, as :class:`sqlite3.Cursor` reads (rows fetched, an id).

    In the writer's pipeline its results come when first read: the row count waits for
    the pipeline to sync (one round trip for every statement queued before it); rows
    are fetched by psycopg on demand.
    """

    def __init__(self, cur: psycopg.Cursor[Any], lastrowid: int | None = None,
                 pipeline: psycopg.Pipeline | None = None):
        self._cur = cur
        self._pipeline = pipeline
        self.lastrowid = lastrowid

    @property
    def rowcount(self) -> int:
        if self._pipeline is not None:
            self._pipeline.sync()
            self._pipeline = None
        return self._cur.rowcount

    def fetchone(self) -> Any:
        return self._cur.fetchone()

    def fetchall(self) -> list[Any]:
        return self._cur.fetchall()

    def fetchmany(self, size: int = 1) -> list[Any]:
        return self._cur.fetchmany(size)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._cur)


class PgConn:
    """A psycopg connection that runs the storage modules' statements (see module doc).

    The writer's transactions run in psycopg's pipeline mode, from ``BEGIN`` to
    ``COMMIT``: a statement is sent at once but its outcome is waited for only when
    something reads it (a row, a row count, a new id) and at ``COMMIT``, so a batch's
    writes that nobody reads (its rows, counters, chunk packs, the run's generation and
    note) cost one round trip together, not one each. A statement that fails fails the
    transaction as before: its error is raised where the pipeline next waits (at the
    latest at ``COMMIT``), and the batch is rolled back whole.

    Args:
        url: the database URL.
        reader: a reader's connection (snapshots, read-only).
        packed: called after a statement that packed a chunk (its open rows then wait
            for a vacuum).
    """

    def __init__(self, url: str, reader: bool = False,
                 packed: Callable[[], None] | None = None):
        self._url = url
        self._reader = reader
        self._packed = packed
        self._held = None if reader else HeldRows()
        self._conn: psycopg.Connection[Any] | None = None
        self._upserts: dict[str, str] = {}
        self._pipe: contextlib.AbstractContextManager[psycopg.Pipeline] | None = None
        self._pipeline: psycopg.Pipeline | None = None
        self._open()

    def _open(self) -> psycopg.Connection[Any]:
        conn = self._conn
        if conn is None or conn.closed:
            conn = self._conn = connect(self._url)
            if self._reader:
                conn.execute("SET default_transaction_read_only = on")
        return conn

    @property
    def raw(self) -> psycopg.Connection[Any]:
        """The psycopg connection (opened again if it broke)."""
        return self._open()

    @property
    def in_transaction(self) -> bool:
        """Whether a transaction is open (or failed and not yet rolled back)."""
        conn = self._conn
        return self._pipeline is not None or (
            conn is not None and not conn.closed
            and conn.info.transaction_status != TransactionStatus.IDLE)

    def _statement(self, sql: str) -> tuple[str, str | None]:
        s, returning = pg_sql(sql, self._reader)
        if returning is not None and returning.startswith("upsert:"):
            table = returning[len("upsert:"):]
            done = self._upserts.get(table)
            if done is None:
                keys = pgschema.KEYS[table]
                done = self._upserts[table] = s.format(updates=", ".join(
                    f"{c}=EXCLUDED.{c}" for c in pgschema.columns(self.raw, table)
                    if c not in keys))
            return done, None
        return s, returning

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> _Cursor:
        """Run one statement (SQLite's form) with ``?`` parameters."""
        s, returning = self._statement(sql)
        held, packs = self._held, s.startswith(pgpack.PACKS)
        if held is not None:
            if packs:
                parameters = (*parameters, *held.arrays(parameters[0], parameters[1]))
            elif s == "ROLLBACK":
                held.drop()
            elif touches(s):
                held.store(self.raw)
        if s == "ROLLBACK":
            self._end_pipeline(failed=True)
        elif s == "BEGIN" and not self._reader:
            self._begin_pipeline()
        cur = self.raw.execute(s, parameters)
        if packs and self._packed is not None:
            self._packed()
        if s == "COMMIT":
            self._end_pipeline()  # waits for every queued statement: raises any error
        if returning is not None:
            row = cur.fetchone()
            return _Cursor(cur, None if row is None else int(row[0]))
        return _Cursor(cur, pipeline=self._pipeline)

    def _begin_pipeline(self) -> None:
        self._end_pipeline(failed=True)  # a transaction left open: its pipeline too
        self._pipe = self.raw.pipeline()
        self._pipeline = self._pipe.__enter__()

    def _end_pipeline(self, failed: bool = False) -> None:
        """Leave pipeline mode, waiting for the outcome of every statement sent.

        Raises:
            psycopg.Error: one of them failed (unless ``failed``: the transaction is
                being rolled back already, and the error was raised before).
        """
        pipe, self._pipe, self._pipeline = self._pipe, None, None
        if pipe is None:
            return
        try:
            pipe.__exit__(None, None, None)
        except psycopg.Error:
            if not failed:
                raise

    def executemany(self, sql: str, parameters: Iterable[Sequence[Any]], /) -> None:
        """Run one statement per parameter row (pipelined by psycopg)."""
        s, _ = self._statement(sql)
        rows = list(parameters)
        if self._held is not None and self.in_transaction:
            if self._held.hold(sql, rows):
                return
            if touches(s):  # as in execute: held rows go first
                self._held.store(self.raw)
        if rows:
            # not closed here: in the writer's pipeline its results are still to come
            self.raw.cursor().executemany(s, rows)

    def close(self) -> None:
        """Close the connection."""
        if self._held is not None:
            self._held.drop()
        self._end_pipeline(failed=True)
        if self._conn is not None:
            self._conn.close()


def connect(url: str) -> psycopg.Connection[Any]:
    """An autocommit psycopg connection to ``url`` (transactions are the caller's BEGIN).

    Raises:
        psycopg.Error: the database cannot be reached; its message never holds the URL's
            password.
    """
    try:
        return psycopg.connect(url, autocommit=True, application_name="gradwatch")
    except psycopg.Error as e:
        secret = password_of(url)
        text = str(e) if secret is None else str(e).replace(secret, "***")
        raise psycopg.OperationalError(f"cannot connect to {masked(url)}: {text}") from None


class PostgresDatabase:
    """A PostgreSQL database (see module doc).

    Args:
        url: ``postgresql://USER[:PASSWORD]@HOST:PORT/DB`` (libpq's forms and its
            environment, ``PGPASSWORD`` and ``~/.pgpass``, apply).
    """

    kind = "postgresql"
    shared = True
    Error: type[Exception] = psycopg.Error

    def __init__(self, url: str):
        self.url = url
        self.where = masked(url)
        self._holds = RunHolds()
        self._packed = threading.Event()

    def open_writer(self) -> PgConn:
        """The writing connection, the schema created or migrated first.

        Raises:
            NewerDatabase: written by a newer gradwatch (left untouched).
            psycopg.Error: unreachable.
        """
        conn = PgConn(self.url, packed=self._packed.set)
        try:
            pgschema.migrate(conn.raw, self.where)
        except BaseException:
            conn.close()
            raise
        return conn

    def close_writer(self, conn: PgConn) -> None:
        """Close the writing connection."""
        conn.close()

    def open_reader(self) -> PgConn:
        """A read-only connection."""
        return PgConn(self.url, reader=True)

    def generation(self, conn: PgConn, run_id: str) -> int | None:
        """The run's write generation (0 before its first write)."""
        row = conn.raw.execute("SELECT gen FROM run_writers WHERE id=%s", (run_id,)).fetchone()
        return 0 if row is None else int(row[0])

    def lock_run(self, conn: PgConn, run_id: str) -> int:
        """A transaction-scoped advisory lock on the run id (one server writes it at a
        time, and a server that died holds nothing); the run's generation, read once the
        lock is held (``gw_lock_run``: one statement)."""
        row = conn.raw.execute("SELECT gw_lock_run(%s, %s)",
                               (run_id, pgschema.RUN_LOCKS)).fetchone()
        assert row is not None  # a function call's one row
        return int(row[0])

    def bump(self, conn: PgConn, run_id: str, generation: int, note: str) -> None:
        """Store the run's new write generation and ``pg_notify`` on :data:`CHANNEL`
        (delivered when the transaction commits). One statement: the writer's CPU per
        batch goes mostly to psycopg's work per statement."""
        conn.raw.execute("WITH g AS (INSERT INTO run_writers(id, gen) VALUES(%s, %s) "
                         "ON CONFLICT (id) DO UPDATE SET gen = EXCLUDED.gen) "
                         "SELECT pg_notify(%s, %s)", (run_id, generation, CHANNEL, note))

    def listen(self, heard: Callable[[str], None], stop: threading.Event) -> None:
        """LISTEN on a connection of its own; connect again after the database restarts."""
        while not stop.is_set():
            try:
                with connect(self.url) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    while not stop.is_set():
                        for n in conn.notifies(timeout=0.5):
                            heard(n.payload)
            except psycopg.Error as e:
                log.warning("listening for other servers' changes failed (%s); again in "
                            "1 s", e)
                stop.wait(1.0)

    def housekeeping(self, stop: threading.Event) -> None:
        """Vacuum the open chunks' tables soon after the writer packed chunks out of them.

        Their rows are inserted and, a chunk later, deleted: without a vacuum (autovacuum
        looks once a minute) their dead rows would hold as many bytes as the steps took
        before packing, until then. Vacuumed at most every :data:`VACUUM_EVERY` seconds,
        they stay about a chunk per open series."""
        conn: psycopg.Connection[Any] | None = None
        try:
            while not stop.is_set():
                if not self._packed.wait(0.5) or stop.wait(VACUUM_EVERY):
                    continue
                self._packed.clear()
                try:
                    if conn is None or conn.closed:
                        conn = connect(self.url)
                    conn.execute(f"VACUUM {', '.join(pgpack.HOT_TABLES)}")
                except psycopg.Error as e:  # the database restarting: the next round
                    log.debug("vacuum failed: %s", e)
        finally:
            if conn is not None:
                conn.close()

    def hold(self, conn: PgConn, run_id: str) -> None:
        """Hold the run while this server takes its stream (:mod:`server.pgholds`)."""
        self._holds.hold(conn.raw, run_id)

    def release(self, conn: PgConn, run_id: str) -> None:
        """Let go of the run."""
        self._holds.release(conn.raw, run_id)

    def unheld(self, conn: PgConn, run_ids: Sequence[str]) -> list[str]:
        """Those of ``run_ids`` no server holds, until the transaction ends."""
        return self._holds.unheld(conn.raw, run_ids)
