"""The SQLite schema of the server's data directory (schema 4), and how connections open.

One database file (``gradwatch.db``, WAL mode) holds every run. A step is stored once, in
the columns of ``steps`` keyed (series, step) (:mod:`server.steptable` owns them), its
per-parameter norms packed in ``param_norms`` and its resets once per distinct set in
``reset_sets``; every other record is kept as its JSON line in ``records``. ``step_agg``
holds, per :data:`CHUNK` consecutive steps of one series, the downsampling bucket of those
steps (:class:`server.downsampling.Bucket`), so a long series downsamples from one summary
per chunk instead of every row. ``PRAGMA user_version`` is :data:`SCHEMA_VERSION`;
:mod:`server.migrate` brings older files to it.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gradwatch.server.backend import Conn

DB_NAME = "gradwatch.db"
CHUNK = 64
"""Steps per pre-aggregated chunk of ``step_agg``."""
SCHEMA_VERSION = 4
"""``PRAGMA user_version`` of a database in the form :data:`SCHEMA` describes."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs(
  rid INTEGER PRIMARY KEY, id TEXT UNIQUE NOT NULL, name TEXT NOT NULL,
  status TEXT NOT NULL, started REAL NOT NULL, updated REAL NOT NULL,
  steps INTEGER NOT NULL DEFAULT 0, findings INTEGER NOT NULL DEFAULT 0,
  ranks TEXT NOT NULL DEFAULT '[]', optimizers TEXT NOT NULL DEFAULT '[]',
  dropped INTEGER NOT NULL DEFAULT 0, torch_version TEXT NOT NULL DEFAULT '',
  world_size INTEGER NOT NULL DEFAULT 1, header TEXT NOT NULL,
  notes TEXT NOT NULL DEFAULT '', tags TEXT NOT NULL DEFAULT '[]');
-- runs.notes, runs.tags (a JSON list): what the user wrote about the run (schema 4).
CREATE TABLE IF NOT EXISTS streams(
  rid INTEGER, rank INTEGER, max_seq INTEGER NOT NULL, ended TEXT,
  dropped INTEGER NOT NULL DEFAULT 0, acked INTEGER, key_hash TEXT,
  PRIMARY KEY(rid, rank)) WITHOUT ROWID;
-- streams.acked: the contiguous prefix of stored seqs (NULL: as max_seq, what servers
-- before it acked); key_hash: SHA-256 of the owner's stream key (NULL: a keyless stream).
CREATE TABLE IF NOT EXISTS records(
  rid INTEGER, rank INTEGER, seq INTEGER, kind TEXT NOT NULL, body TEXT NOT NULL,
  PRIMARY KEY(rid, rank, seq)) WITHOUT ROWID;
-- records: every record but steps and scalars, as its JSON line (rare).
CREATE TABLE IF NOT EXISTS series(
  sid INTEGER PRIMARY KEY, rid INTEGER NOT NULL, rank INTEGER NOT NULL, opt TEXT NOT NULL,
  next_chunk INTEGER NOT NULL DEFAULT 0, keep_every INTEGER NOT NULL DEFAULT 1,
  UNIQUE(rid, rank, opt));
CREATE TABLE IF NOT EXISTS steps(
  sid INTEGER, step INTEGER, seq INTEGER NOT NULL, t REAL,
  norm REAL, fresh_norm REAL, drift REAL, flags INTEGER NOT NULL,
  stale INTEGER, leaked INTEGER, late INTEGER, discarded INTEGER,
  backwards INTEGER, consumed INTEGER, fresh INTEGER, closure_evals INTEGER,
  rset INTEGER, loss REAL, lr TEXT, detail TEXT,
  PRIMARY KEY(sid, step)) WITHOUT ROWID;
-- steps.flags: steptable.FLAG_* (a NULL norm that was NaN, fresh_norm equal to norm, ...);
-- rset: reset_sets.id; detail: JSON of what the columns do not hold.
CREATE TABLE IF NOT EXISTS param_norms(
  sid INTEGER, step INTEGER, norms, fresh, PRIMARY KEY(sid, step)) WITHOUT ROWID;
-- param_norms: float32 bytes (BLOB), or the wire's JSON text (float64 values, missing
-- entries); fresh is NULL where it equals norms (steps.flags says which).
CREATE TABLE IF NOT EXISTS reset_sets(
  id INTEGER PRIMARY KEY, body TEXT UNIQUE NOT NULL, summary TEXT);
-- reset_sets.summary: "how:n;how:n", what a plot row shows of the set.
CREATE TABLE IF NOT EXISTS scalars(
  rid INTEGER, rank INTEGER, seq INTEGER, step INTEGER NOT NULL, opt TEXT,
  vals TEXT NOT NULL, t REAL NOT NULL, PRIMARY KEY(rid, rank, seq)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS scalars_by_step ON scalars(rid, opt, step);
CREATE TABLE IF NOT EXISTS step_agg(
  sid INTEGER, chunk INTEGER, n INTEGER,
  mn_norm REAL, mn_norm_step INTEGER, mx_norm REAL, mx_norm_step INTEGER,
  mn_drift REAL, mn_drift_step INTEGER, mx_drift REAL, mx_drift_step INTEGER,
  flag_step INTEGER, odd_step INTEGER, sig TEXT,
  PRIMARY KEY(sid, chunk)) WITHOUT ROWID;
-- step_agg: odd_step is the chunk's own odd-reset row; sig is {signature: [rows, first
-- step]}, from which a bucket of several chunks finds its own.
CREATE TABLE IF NOT EXISTS optimizers(
  rid INTEGER, rank INTEGER, opt TEXT, body TEXT NOT NULL,
  PRIMARY KEY(rid, rank, opt)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS findings(
  rid INTEGER, rank INTEGER, opt TEXT, kind TEXT, first_step INTEGER, body TEXT NOT NULL,
  PRIMARY KEY(rid, rank, opt, kind)) WITHOUT ROWID;
"""

RUN_TABLES = ("streams", "records", "scalars", "optimizers", "findings", "runs")
"""Tables keyed by run; a run's series (``series``, ``steps``, ``param_norms``,
``step_agg``) go with them (:func:`delete_run`)."""


def connect(data_dir: Path, readonly: bool = False) -> sqlite3.Connection:
    """Open the data directory's database (the schema is :func:`server.migrate.open_current`'s
    job).

    Raises:
        sqlite3.Error / OSError: the directory or file cannot be used.
    """
    path = data_dir / DB_NAME
    if readonly:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False,
                               isolation_level=None, timeout=30)
    else:
        conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None,
                               timeout=30)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA cache_size=-65536")
    return conn


def delete_run(conn: Conn, rid: int) -> None:
    """Delete everything stored for one run (inside the caller's transaction)."""
    sids = [s for (s,) in conn.execute("SELECT sid FROM series WHERE rid=?", (rid,))]
    for sid in sids:
        for table in ("steps", "param_norms", "step_agg"):
            conn.execute(f"DELETE FROM {table} WHERE sid=?", (sid,))
    conn.execute("DELETE FROM series WHERE rid=?", (rid,))
    for table in RUN_TABLES:
        conn.execute(f"DELETE FROM {table} WHERE rid=?", (rid,))
