"""The PostgreSQL schema of a gradwatch database, its versions and migrations.

The tables are SQLite's (:mod:`server.db`), column for column and in the same order, so
the storage modules' statements run on both (:mod:`server.pgdb` writes them in
PostgreSQL's form): 64-bit integers where SQLite's INTEGER is, ``double precision`` for
REAL, ``bytea`` for the packed per-parameter norms, text ordered byte by byte
(``COLLATE "C"``, SQLite's order) where reads sort by it. ``gradwatch_schema`` holds the
version; :func:`migrate` brings an older database to :data:`SCHEMA_VERSION` in one
transaction under an advisory lock, so servers starting together migrate once, and
refuses one written by a newer gradwatch. From schema 6 the steps of summarised chunks
are packed (:mod:`server.pgpack`): ``steps`` and ``param_norms`` become views. Runs on
the writer's connection before anything else touches it. Plain module: no FastAPI.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from gradwatch.server import pgpack
from gradwatch.server.errors import NewerDatabase
from gradwatch.server.migrate import statements

log = logging.getLogger(__name__)

SCHEMA_VERSION = 8
"""The current version. :data:`SCHEMA` is version 4, numbered as SQLite's
(:data:`server.db.SCHEMA_VERSION`), whose tables it mirrors; :data:`MIGRATIONS` go on
from it, for a new database too."""
FIRST_VERSION = 4
"""The version :data:`SCHEMA` creates."""

RUN_LOCKS = 0x67727275  # "grru"
"""Seed of the run-id hash that keys a run's write lock (``pg_advisory_xact_lock``)."""

MIGRATION_LOCK = 0x67726164  # "grad"
"""``pg_advisory_xact_lock`` key held while the schema is created or migrated."""

SCHEMA = """
CREATE TABLE runs(
  rid BIGSERIAL PRIMARY KEY, id TEXT COLLATE "C" UNIQUE NOT NULL,
  name TEXT COLLATE "C" NOT NULL, status TEXT NOT NULL, started DOUBLE PRECISION NOT NULL,
  updated DOUBLE PRECISION NOT NULL, steps BIGINT NOT NULL DEFAULT 0,
  findings BIGINT NOT NULL DEFAULT 0, ranks TEXT NOT NULL DEFAULT '[]',
  optimizers TEXT NOT NULL DEFAULT '[]', dropped BIGINT NOT NULL DEFAULT 0,
  torch_version TEXT NOT NULL DEFAULT '', world_size BIGINT NOT NULL DEFAULT 1,
  header TEXT NOT NULL, notes TEXT NOT NULL DEFAULT '', tags TEXT NOT NULL DEFAULT '[]');
CREATE INDEX runs_by_name ON runs(name);
CREATE TABLE streams(
  rid BIGINT, rank BIGINT, max_seq BIGINT NOT NULL, ended TEXT,
  dropped BIGINT NOT NULL DEFAULT 0, acked BIGINT, key_hash TEXT, PRIMARY KEY(rid, rank));
CREATE TABLE records(
  rid BIGINT, rank BIGINT, seq BIGINT, kind TEXT COLLATE "C" NOT NULL, body TEXT NOT NULL,
  PRIMARY KEY(rid, rank, seq));
CREATE TABLE series(
  sid BIGSERIAL PRIMARY KEY, rid BIGINT NOT NULL, rank BIGINT NOT NULL,
  opt TEXT COLLATE "C" NOT NULL, next_chunk BIGINT NOT NULL DEFAULT 0,
  keep_every BIGINT NOT NULL DEFAULT 1, UNIQUE(rid, rank, opt));
CREATE TABLE steps(
  sid BIGINT, step BIGINT, seq BIGINT NOT NULL, t DOUBLE PRECISION,
  norm DOUBLE PRECISION, fresh_norm DOUBLE PRECISION, drift DOUBLE PRECISION,
  flags INTEGER NOT NULL, stale BIGINT, leaked BIGINT, late BIGINT, discarded BIGINT,
  backwards BIGINT, consumed BIGINT, fresh BIGINT, closure_evals BIGINT,
  rset BIGINT, loss DOUBLE PRECISION, lr TEXT, detail TEXT, PRIMARY KEY(sid, step));
-- steps.flags: steptable.FLAG_*; NaN is NULL plus its flag, as in SQLite.
CREATE TABLE param_norms(
  sid BIGINT, step BIGINT, norms BYTEA, fresh BYTEA, PRIMARY KEY(sid, step));
-- param_norms: float32 bytes, or the wire's JSON text as bytes (steptable.pack_norms).
CREATE TABLE reset_sets(id BIGSERIAL PRIMARY KEY, body TEXT NOT NULL, summary TEXT);
-- one row per distinct body, unique by digest: a body may pass a btree entry's limit
CREATE UNIQUE INDEX reset_sets_body ON reset_sets(md5(body));
CREATE TABLE scalars(
  rid BIGINT, rank BIGINT, seq BIGINT, step BIGINT NOT NULL, opt TEXT COLLATE "C",
  vals TEXT NOT NULL, t DOUBLE PRECISION NOT NULL, PRIMARY KEY(rid, rank, seq));
CREATE INDEX scalars_by_step ON scalars(rid, opt, step);
CREATE TABLE step_agg(
  sid BIGINT, chunk BIGINT, n BIGINT,
  mn_norm DOUBLE PRECISION, mn_norm_step BIGINT, mx_norm DOUBLE PRECISION,
  mx_norm_step BIGINT, mn_drift DOUBLE PRECISION, mn_drift_step BIGINT,
  mx_drift DOUBLE PRECISION, mx_drift_step BIGINT, flag_step BIGINT, odd_step BIGINT,
  sig TEXT, PRIMARY KEY(sid, chunk));
CREATE TABLE optimizers(
  rid BIGINT, rank BIGINT, opt TEXT COLLATE "C", body TEXT NOT NULL,
  PRIMARY KEY(rid, rank, opt));
CREATE TABLE findings(
  rid BIGINT, rank BIGINT, opt TEXT COLLATE "C", kind TEXT COLLATE "C",
  first_step BIGINT, body TEXT NOT NULL, PRIMARY KEY(rid, rank, opt, kind));
"""

KEYS = {"optimizers": ("rid", "rank", "opt"), "findings": ("rid", "rank", "opt", "kind"),
        "step_agg": ("sid", "chunk")}
"""Primary keys of the tables SQLite's ``INSERT OR REPLACE`` writes (an upsert here)."""

Migration = Callable[[Any], None]


def _to_5(conn: Any) -> None:
    """Schema 5: each run's write generation, so servers sharing the database see when
    another wrote a run and rebuild its state (:meth:`server.pgdb.PostgresDatabase.bump`)."""
    conn.execute("CREATE TABLE run_writers(id TEXT PRIMARY KEY, gen BIGINT NOT NULL)")


def _to_6(conn: Any) -> None:
    """Schema 6: steps packed per chunk of a series (:mod:`server.pgpack`); the rows of
    every summarised chunk of the database are packed."""
    conn.execute(pgpack.SCHEMA_6)


def _to_7(conn: Any) -> None:
    """Schema 7: ``gw_put_pack`` in PL/pgSQL (its plan kept by the session), same
    meaning (:func:`server.pgpack.put_pack`)."""
    conn.execute(pgpack.put_pack())


LOCK_RUN = """
CREATE OR REPLACE FUNCTION gw_lock_run(run TEXT, seed BIGINT) RETURNS BIGINT
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_advisory_xact_lock(hashtextextended(run, seed));
  -- a statement of its own: its snapshot is taken once the lock is held, so it sees the
  -- write of a server that held the lock before
  RETURN coalesce((SELECT gen FROM run_writers WHERE id = run), 0);
END $$"""
"""A run's write lock and its generation read under it, in one statement
(:meth:`server.pgdb.PostgresDatabase.lock_run`)."""


def _to_8(conn: Any) -> None:
    """Schema 8: ``gw_lock_run``, a run's lock and generation in one call (a batch's
    statements cost the writer's CPU each, in psycopg)."""
    conn.execute(LOCK_RUN)


MIGRATIONS: dict[int, Migration] = {5: _to_5, 6: _to_6, 7: _to_7, 8: _to_8}
"""Per version N > 4: the step from N - 1 to N, run inside the migration's transaction."""


def columns(conn: Any, table: str) -> list[str]:
    """The columns of ``table``, in order."""
    return [r[0] for r in conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = "
        "current_schema() AND table_name = %s ORDER BY ordinal_position", (table,))]


def migrate(conn: Any, where: str) -> None:
    """Bring the database on ``conn`` (psycopg, autocommit) to :data:`SCHEMA_VERSION`.

    Raises:
        NewerDatabase: written by a newer gradwatch (left untouched).
    """
    conn.execute("BEGIN")
    try:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        conn.execute("CREATE TABLE IF NOT EXISTS gradwatch_schema(version INTEGER NOT NULL)")
        row = conn.execute("SELECT version FROM gradwatch_schema").fetchone()
        version = 0 if row is None else int(row[0])
        if version > SCHEMA_VERSION:
            raise NewerDatabase(
                f"{where} was written by a newer gradwatch (database schema {version}; this "
                f"gradwatch knows up to {SCHEMA_VERSION}): upgrade gradwatch, or serve "
                f"another --db")
        if version == 0:
            for s in statements(SCHEMA):
                conn.execute(s)
            conn.execute("INSERT INTO gradwatch_schema VALUES(%s)", (FIRST_VERSION,))
            log.info("created the gradwatch tables in %s", where)
            version = FIRST_VERSION
        if version < SCHEMA_VERSION:
            log.info("migrating %s from schema %d to %d...", where, version, SCHEMA_VERSION)
            for v in range(version + 1, SCHEMA_VERSION + 1):
                MIGRATIONS[v](conn)
            conn.execute("UPDATE gradwatch_schema SET version=%s", (SCHEMA_VERSION,))
            log.info("migrated")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
