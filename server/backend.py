"""The storage interface: where a server stores (``--db``), and what every backend gives.

Two halves, each a :class:`typing.Protocol`:

- :class:`Storage` names the operations of docs/design.md §7: store a batch and return what
  changed, start and end an import, delete, rename, annotate, resume position, ownership,
  and (through its ``reader``) the reads: runs, run, steps, per-parameter norms, scalars,
  findings, exports. :class:`server.storage.Store` is it, over either database.
- :class:`Database` is what one engine supplies to it: connections at the current schema
  (its migrations run on open), the engine's error class, and its housekeeping. The
  storage modules speak a small DB-API subset (:class:`Conn`); SQLite's connection is one,
  PostgreSQL's is adapted to it (:mod:`server.pgdb`), which writes each statement in
  PostgreSQL's form. The row rules keep their Python homes (``rows.must_keep``,
  ``downsampling.Bucket``, ``verdict.carries_facts``); their SQL forms are generated once
  (:mod:`server.steptable`) and held equal to them by the same tests on both engines.

:func:`open_database` picks the engine from a URL (``postgresql://...``) or a data
directory (SQLite, the default). psycopg is imported only for a PostgreSQL URL, so a server
without the ``[postgres]`` extra runs on SQLite as before. Plain module: no FastAPI.
"""

from __future__ import annotations

import concurrent.futures as cf
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

from gradwatch.frames import OptimizerView, ParamSeries, RunSummary, ScalarSeries
from gradwatch.server.batch import Batch, IngestResult
from gradwatch.server.rows import SeriesRows
from gradwatch.wire import Finding, Header

T = TypeVar("T")

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


class Cursor(Protocol):
    """What a statement returns: rows and counts, as :mod:`sqlite3` gives them."""

    rowcount: int
    lastrowid: int | None

    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...
    def fetchmany(self, size: int = ...) -> list[Any]: ...
    def __iter__(self) -> Iterator[Any]: ...


class Conn(Protocol):
    """The DB-API subset the storage modules use (``?`` placeholders, SQLite's words)."""

    @property
    def in_transaction(self) -> bool: ...
    def execute(self, sql: str, parameters: Sequence[Any] = ..., /) -> Any: ...
    def executemany(self, sql: str, parameters: Iterable[Sequence[Any]], /) -> Any: ...
    def close(self) -> None: ...


@runtime_checkable
class Database(Protocol):
    """One database engine, as :class:`~server.storage.Store` and
    :class:`~server.reader.Reader` use it.

    Attributes:
        kind: ``"sqlite"`` or ``"postgresql"``.
        where: the database as messages name it (a password masked).
        Error: the engine's error class: a write it raises is rolled back and refused
            (:class:`~server.errors.StorageFailed`).
        shared: several servers may write it at once (runs' write generations, notes).
    """

    kind: str
    shared: bool
    where: str
    Error: type[Exception]

    def open_writer(self) -> Conn:
        """The connection that writes, the schema brought to the current version first.

        Raises:
            NewerDatabase: written by a newer gradwatch (left untouched).
        """

    def close_writer(self, conn: Any) -> None:
        """Close the writing connection (SQLite folds its WAL in first)."""

    def open_reader(self) -> Conn:
        """A read-only connection; ``BEGIN`` on it starts one consistent snapshot."""

    def housekeeping(self, stop: threading.Event) -> None:
        """Run beside the writer until ``stop`` is set (SQLite: WAL checkpoints)."""

    def generation(self, conn: Any, run_id: str) -> int | None:
        """How many writes of the run any server has committed (bumped by each), so a
        server sees another wrote it since; None where one process writes (SQLite)."""

    def lock_run(self, conn: Any, run_id: str) -> int | None:
        """Inside a write transaction: be the run's one writer until it ends (servers
        sharing the database take turns; a no-op for SQLite's single writer). Returns
        the run's :meth:`generation`, read once the lock is held."""

    def bump(self, conn: Any, run_id: str, generation: int, note: str) -> None:
        """Record the run's new write generation and tell the other servers on this
        database of the change (``note``, :mod:`server.remote`), once the write's
        transaction commits (inside it); a no-op where one server writes."""

    def listen(self, heard: Callable[[str], None], stop: threading.Event) -> None:
        """Call ``heard`` with each other server's note until ``stop`` is set (returns at
        once where one server writes)."""

    def hold(self, conn: Any, run_id: str) -> None:
        """This server takes the run's stream: hold the run until :meth:`release` or this
        server's end, so that no other server marks it interrupted meanwhile
        (:mod:`server.pgholds`; a no-op where one server writes)."""

    def release(self, conn: Any, run_id: str) -> None:
        """Let go of a run :meth:`hold` took (its stream ended or left this server)."""

    def unheld(self, conn: Any, run_ids: Sequence[str]) -> list[str]:
        """Inside a write transaction: those of ``run_ids`` no server holds (this one
        included), kept so until it ends (where one server writes: all of them)."""


class Reads(Protocol):
    """The read half of :class:`Storage` (thread-safe; called from worker threads)."""

    def runs(self) -> list[RunSummary]: ...
    def summary(self, run_id: str) -> RunSummary | None: ...
    def run(self, run_id: str) -> dict[str, Any] | None: ...
    def optimizers(self, run_id: str) -> list[OptimizerView]: ...
    def findings(self, run_id: str) -> list[Finding] | None: ...
    def steps(self, run_id: str, start: int | None = None, end: int | None = None,
              max_points: int = 4000, opt: str | None = None, rank: int | None = None,
              last: dict[tuple[int, str], int] | None = None) -> SeriesRows | None: ...
    def params(self, run_id: str, opt: str, rank: int = 0, start: int | None = None,
               end: int | None = None, max_points: int = 500) -> ParamSeries | None: ...
    def scalars(self, run_id: str, limit: int = 200_000) -> ScalarSeries | None: ...
    def export_lines(self, run_id: str, rank: int = 0) -> Iterator[str] | None: ...
    def export_csv(self, run_id: str) -> Iterator[str] | None: ...
    def close(self) -> None: ...


class Storage(Protocol):
    """The named storage operations; writes run on the storage's writer (:meth:`submit`).

    Every write operation raises the domain errors of :mod:`server.errors`, never the
    engine's own.
    """

    @property
    def database(self) -> Database:
        """The database it stores in."""

    @property
    def reader(self) -> Reads:
        """Its reads."""

    @property
    def server(self) -> str:
        """This server's id among those sharing the database (:mod:`server.remote`)."""

    def start(self) -> None: ...
    def close(self, timeout: float = 30.0) -> None: ...
    def submit(self, fn: Callable[..., T], *args: Any, run: str | None = None,
               urgent: bool = False, timer: bool = False) -> cf.Future[T]: ...
    def call(self, fn: Callable[..., T], *args: Any, timeout: float = 60.0) -> T: ...
    def ingest(self, batch: Batch, name: str | None = None,
               key: str | None = None) -> IngestResult: ...
    def import_start(self, header: Header, name: str | None = None) -> str: ...
    def import_end(self, run_id: str) -> None: ...
    def delete(self, run_id: str) -> bool: ...
    def rename(self, run_id: str, name: str) -> RunSummary | None: ...
    def annotate(self, run_id: str, notes: str | None, tags: list[str] | None
                 ) -> RunSummary | None: ...
    def resume_seq(self, run_id: str, rank: int, key: str | None = None) -> int: ...
    def owns(self, run_id: str, rank: int, key: str | None) -> bool: ...
    def mark_interrupted(self, run_id: str) -> RunSummary | None: ...
    def sweep(self) -> list[str]: ...


class UnknownDatabase(ValueError):
    """A ``--db`` that names no database gradwatch can store in (or lacks its driver)."""


_PASSWORD = re.compile(r"(://[^:/@]*:)([^@/]*)(@)")
# libpq also takes it as a query parameter: postgresql://u@h/db?password=...
_QUERY_PASSWORD = re.compile(r"(?i)([?&]password=)([^&#\s]*)")


def masked(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for logs and errors)."""
    return _QUERY_PASSWORD.sub(r"\1***", _PASSWORD.sub(r"\1***\3", url))


def password_of(url: str) -> str | None:
    """The password in ``url``, or None (so that errors can be scrubbed of it)."""
    for pattern, group in ((_PASSWORD, 2), (_QUERY_PASSWORD, 2)):
        m = pattern.search(url)
        if m and m.group(group):
            return m.group(group)
    return None


def is_postgres(where: object) -> bool:
    """Whether ``where`` is a PostgreSQL URL."""
    return isinstance(where, str) and where.startswith(POSTGRES_SCHEMES)


def open_database(where: Path | str | Database) -> Database:
    """The database at ``where``: a data directory (SQLite) or a ``postgresql://`` URL.

    Raises:
        UnknownDatabase: a URL of another kind, or a PostgreSQL URL without psycopg
            installed (the message names the ``gradwatch[postgres]`` extra).
    """
    if isinstance(where, Database):
        return where
    if is_postgres(where):
        assert isinstance(where, str)
        try:
            import psycopg  # noqa: F401
        except ImportError:
            raise UnknownDatabase(
                f"{masked(where)} is a PostgreSQL database, which needs the psycopg driver: "
                f"pip install 'gradwatch[postgres]'") from None
        from gradwatch.server.pgdb import PostgresDatabase
        return PostgresDatabase(where)
    if isinstance(where, str) and "://" in where:
        scheme = where.split("://", 1)[0]
        if scheme != "sqlite":
            raise UnknownDatabase(
                f"gradwatch stores in SQLite (a data directory) or PostgreSQL "
                f"(postgresql://USER@HOST:PORT/DB), not {scheme}://")
        where = where.split("://", 1)[1]
    from gradwatch.server.sqlitedb import SqliteDatabase
    return SqliteDatabase(Path(where))
