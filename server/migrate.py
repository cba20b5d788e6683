"""Bring a data directory's database to :data:`server.db.SCHEMA_VERSION` on start.

Runs on the storage writer's connection before anything else touches it. Each migration
is one transaction: a database is either wholly in its old form or wholly in the new. A
database written by a newer gradwatch is refused (:class:`server.errors.NewerDatabase`),
never changed. After a migration the file is compacted (``VACUUM``) and its files kept
private to their owner. Plain module: no FastAPI.

Schema 2 (gradwatch 0.1.0; ``user_version`` 0 to 2) kept every record as its JSON line
in ``records`` and spread steps into columns keyed (run, rank, opt, step) beside it.
Schema 3 keeps a step once, in columns keyed (series, step) (:mod:`server.steptable`).
Schema 4 adds each run's notes and tags (``runs.notes``, ``runs.tags``), empty for the runs
an older file holds.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gradwatch.server import chunks, db
from gradwatch.server.errors import NewerDatabase
from gradwatch.server.files import private_files
from gradwatch.server.steptable import PARAMS_INSERT, STEPS_INSERT, step_columns
from gradwatch.server.writes import ResetSets, step_row
from gradwatch.validation import plain_error
from gradwatch.wire import Step

log = logging.getLogger(__name__)

_CURRENT_SUMMARIES = 2
"""Schema 2 files below this ``user_version`` hold chunk summaries of an older form (they
kept only each chunk's usual resets): rebuilt from the steps while migrating."""


def statements(script: str) -> list[str]:
    """The SQL statements of a script (comment lines dropped), to run one by one inside a
    transaction (``executescript`` would commit first)."""
    text = "\n".join(x for x in script.splitlines() if not x.lstrip().startswith("--"))
    return [s.strip() for s in text.split(";") if s.strip()]


def open_current(data_dir: Path) -> sqlite3.Connection:
    """The writable connection to the data directory's database, at the current schema.

    Raises:
        NewerDatabase: the file was written by a newer gradwatch (left untouched).
        sqlite3.Error / OSError: the directory or file cannot be used.
    """
    conn = db.connect(data_dir)
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > db.SCHEMA_VERSION:
        conn.close()
        raise NewerDatabase(
            f"{data_dir / db.DB_NAME} was written by a newer gradwatch (database schema "
            f"{version}; this gradwatch knows up to {db.SCHEMA_VERSION}): upgrade gradwatch, "
            f"or serve another --data-dir")
    has_runs = conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND "
                            "name='runs'").fetchone() is not None
    if not has_runs:
        _in_transaction(conn, lambda: _create(conn))
    elif version < db.SCHEMA_VERSION:
        old = 2 if version < 3 else version
        log.info("migrating %s from schema %d to %d (once)...", data_dir / db.DB_NAME, old,
                 db.SCHEMA_VERSION)
        _in_transaction(conn, lambda: _migrate(conn, version))
        if old > 2:  # only notes and tags were added: nothing to compact
            private_files(data_dir)
            log.info("migrated")
            return conn
        try:  # gives back the room the JSON copies took; needs that much free space
            conn.execute("VACUUM")
        except sqlite3.Error as e:
            log.warning("migrated, but could not compact the database (%s); it works as "
                        "it is, larger than it need be", e)
        private_files(data_dir)
        log.info("migrated")
    return conn


def _in_transaction(conn: sqlite3.Connection, fn: Any) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        fn()
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _create(conn: sqlite3.Connection) -> None:
    for s in statements(db.SCHEMA):
        conn.execute(s)
    conn.execute(f"PRAGMA user_version={db.SCHEMA_VERSION}")


def _migrate(conn: sqlite3.Connection, version: int) -> None:
    """Bring a schema 2 or 3 file to the current schema (inside one transaction)."""
    if version < 3:
        _from_2(conn, version)  # keeps the runs table as it was
    _from_3(conn)
    conn.execute(f"PRAGMA user_version={db.SCHEMA_VERSION}")


def _from_3(conn: sqlite3.Connection) -> None:
    """Schema 4: the runs table gets notes and tags (empty), where it has none yet."""
    have = {row[1] for row in conn.execute("PRAGMA table_info(runs)")}
    if "notes" not in have:
        conn.execute("ALTER TABLE runs ADD COLUMN notes TEXT NOT NULL DEFAULT ''")
    if "tags" not in have:
        conn.execute("ALTER TABLE runs ADD COLUMN tags TEXT NOT NULL DEFAULT '[]'")


def _from_2(conn: sqlite3.Connection, version: int) -> None:
    for t in ("steps", "series", "step_agg", "records", "streams"):
        conn.execute(f"ALTER TABLE {t} RENAME TO v2_{t}")
    _create(conn)
    conn.execute("INSERT INTO series(rid, rank, opt, next_chunk) SELECT rid, rank, opt, "
                 "next_chunk FROM v2_series ORDER BY rid, rank, opt")
    conn.execute("INSERT OR IGNORE INTO series(rid, rank, opt) SELECT DISTINCT rid, rank, "
                 "opt FROM v2_steps")
    conn.execute("INSERT INTO step_agg SELECT e.sid, a.chunk, a.n, a.mn_norm, "
                 "a.mn_norm_step, a.mx_norm, a.mx_norm_step, a.mn_drift, a.mn_drift_step, "
                 "a.mx_drift, a.mx_drift_step, a.flag_step, a.odd_step, a.sig FROM v2_step_agg "
                 "a JOIN series e ON e.rid=a.rid AND e.rank=a.rank AND e.opt=a.opt")
    conn.execute("INSERT INTO records SELECT rid, rank, seq, kind, body FROM v2_records "
                 "WHERE kind != 'step'")
    conn.execute("INSERT INTO streams(rid, rank, max_seq, ended, dropped) SELECT rid, rank, "
                 "max_seq, ended, dropped FROM v2_streams")
    sids = {(rid, rank, opt): sid for sid, rid, rank, opt in conn.execute(
        "SELECT sid, rid, rank, opt FROM series")}
    started = dict(conn.execute("SELECT rid, started FROM runs").fetchall())
    resets = ResetSets()
    moved = repaired = lost = 0
    last_t: dict[int, float] = {}
    cur = conn.execute("SELECT s.rid, s.rank, s.opt, r.body FROM v2_steps s JOIN v2_records r "
                       "ON r.rid=s.rid AND r.rank=s.rank AND r.seq=s.seq "
                       "ORDER BY s.rid, s.rank, s.opt, s.step")
    while rows := cur.fetchmany(2000):
        steps, params = [], []
        for rid, rank, opt, body in rows:
            sid = sids[(rid, rank, opt)]
            d = json.loads(body)
            t = d.get("t")
            if not isinstance(t, (int, float)) or not math.isfinite(t):
                # Stored by a release that took any time: the series' previous one stands in.
                d["t"] = last_t.get(sid, started.get(rid, 0.0))
                repaired += 1
            try:
                s = Step.model_validate(d)
            except ValidationError as e:
                log.warning("migration: a stored step record no longer validates, left out: "
                            "%s", plain_error(e))
                lost += 1
                continue
            last_t[sid] = s.t
            c = step_columns(s)
            steps.append(step_row(conn, sid, c, resets))
            if c.has_params():
                params.append((sid, s.step, c.params, c.pfresh))
        conn.executemany(STEPS_INSERT, steps)
        conn.executemany(PARAMS_INSERT, params)
        moved += len(steps)
    for t in ("steps", "series", "step_agg", "records", "streams"):
        conn.execute(f"DROP TABLE v2_{t}")
    if version < _CURRENT_SUMMARIES:
        log.info("rebuilt %d step summaries of an older form", chunks.rebuild(conn))
    log.info("migration: %d steps moved to columns%s%s", moved,
             f", {repaired} with a non-finite time given the one before" if repaired else "",
             f", {lost} unreadable left out" if lost else "")
