"""The SQLite schema of the server's data directory, and how connections are opened.

One database file (``gradwatch.db``, WAL mode) holds every run. Each record is stored
once, by (run, rank, seq), as its JSON line; step records are also spread into columns for
the plots (per-parameter norms stay in the record; :mod:`server.steptable`). ``step_agg``
holds, per :data:`CHUNK` consecutive steps of one (rank, opt), the downsampling bucket of
those steps (:class:`server.downsampling.Bucket`), so a long series downsamples from one
summary per chunk instead of every row.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

DB_NAME = "gradwatch.db"
CHUNK = 64
"""Steps per pre-aggregated chunk of ``step_agg``."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs(
  rid INTEGER PRIMARY KEY, id TEXT UNIQUE NOT NULL, name TEXT NOT NULL,
  status TEXT NOT NULL, started REAL NOT NULL, updated REAL NOT NULL,
  steps INTEGER NOT NULL DEFAULT 0, findings INTEGER NOT NULL DEFAULT 0,
  ranks TEXT NOT NULL DEFAULT '[]', optimizers TEXT NOT NULL DEFAULT '[]',
  dropped INTEGER NOT NULL DEFAULT 0, torch_version TEXT NOT NULL DEFAULT '',
  world_size INTEGER NOT NULL DEFAULT 1, header TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS streams(
  rid INTEGER, rank INTEGER, max_seq INTEGER NOT NULL, ended TEXT,
  dropped INTEGER NOT NULL DEFAULT 0, PRIMARY KEY(rid, rank)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS records(
  rid INTEGER, rank INTEGER, seq INTEGER, kind TEXT NOT NULL, body TEXT NOT NULL,
  PRIMARY KEY(rid, rank, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS steps(
  rid INTEGER, rank INTEGER, opt TEXT, step INTEGER, seq INTEGER, t REAL,
  norm REAL, fresh_norm REAL, drift REAL, nan INTEGER, stale INTEGER, leaked INTEGER,
  late INTEGER, discarded INTEGER, skipped INTEGER, resets TEXT, loss REAL, lr TEXT,
  PRIMARY KEY(rid, rank, opt, step)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS series(
  rid INTEGER, rank INTEGER, opt TEXT, next_chunk INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY(rid, rank, opt)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS step_agg(
  rid INTEGER, rank INTEGER, opt TEXT, chunk INTEGER, n INTEGER,
  mn_norm REAL, mn_norm_step INTEGER, mx_norm REAL, mx_norm_step INTEGER,
  mn_drift REAL, mn_drift_step INTEGER, mx_drift REAL, mx_drift_step INTEGER,
  flag_step INTEGER, odd_step INTEGER, sig TEXT,
  PRIMARY KEY(rid, rank, opt, chunk)) WITHOUT ROWID;
-- step_agg: odd_step is the chunk's own odd-reset row; sig is {signature: [rows, first
-- step]}, from which a bucket of several chunks finds its own.
CREATE TABLE IF NOT EXISTS optimizers(
  rid INTEGER, rank INTEGER, opt TEXT, body TEXT NOT NULL,
  PRIMARY KEY(rid, rank, opt)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS findings(
  rid INTEGER, rank INTEGER, opt TEXT, kind TEXT, first_step INTEGER, body TEXT NOT NULL,
  PRIMARY KEY(rid, rank, opt, kind)) WITHOUT ROWID;
"""

RUN_TABLES = ("streams", "records", "steps", "series", "step_agg", "optimizers",
              "findings", "runs")

SUMMARY_VERSION = 2
"""``PRAGMA user_version`` once ``step_agg`` holds summaries of the current form (version
1 kept only each chunk's usual resets and took the latest step on a tie for a max)."""


def connect(data_dir: Path, readonly: bool = False) -> sqlite3.Connection:
    """Open the data directory's database (creating the schema when writing).

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
        conn.executescript(SCHEMA)
        _add_step_columns(conn)
    conn.execute("PRAGMA cache_size=-65536")
    return conn


STEP_COLUMNS_ADDED = (("loss", "REAL"), ("lr", "TEXT"))
"""Columns of ``steps`` added after the table was first shipped (a step's loss, and its
param groups' learning rates as a JSON list): added to an older file when it is opened."""


def _add_step_columns(conn: sqlite3.Connection) -> None:
    have = {row[1] for row in conn.execute("PRAGMA table_info(steps)")}
    for name, kind in STEP_COLUMNS_ADDED:
        if name not in have:
            conn.execute(f"ALTER TABLE steps ADD COLUMN {name} {kind}")


def summaries_outdated(conn: sqlite3.Connection) -> bool:
    """Whether ``step_agg`` holds summaries of an older form (to rebuild from ``steps``)."""
    if conn.execute("PRAGMA user_version").fetchone()[0] >= SUMMARY_VERSION:
        return False
    return conn.execute("SELECT 1 FROM step_agg LIMIT 1").fetchone() is not None


def mark_summaries_current(conn: sqlite3.Connection) -> None:
    """Record that every ``step_agg`` row is of the current form."""
    conn.execute(f"PRAGMA user_version={SUMMARY_VERSION}")
