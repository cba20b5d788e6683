"""Chunk summaries (``step_agg``) of a run's series, written on the storage writer thread.

Every :data:`~server.db.CHUNK` consecutive steps of one (rank, opt) get one ``step_agg`` row:
the downsampling :class:`~server.downsampling.Bucket` of those steps. Steps of a series
arrive in order, so a chunk is summarised once a row of a later chunk arrives; the rows of
the open chunk are kept in memory, or read back from the database when rows stored before
a restart, or a resent gap, belong to it.
"""

from __future__ import annotations

import logging
import sqlite3

from gradwatch.server import db
from gradwatch.server.downsampling import Bucket
from gradwatch.server.rows import Row
from gradwatch.server.steptable import agg_values, read_rows

log = logging.getLogger(__name__)

_INSERT = "INSERT OR REPLACE INTO step_agg VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"


def summarise(conn: sqlite3.Connection, key: tuple[int, int, str], chunk: int,
              rows: list[Row]) -> None:
    """Write the ``step_agg`` row of one chunk of ``key`` (rid, rank, opt) from its rows."""
    if not rows:
        return
    b = Bucket()
    for r in rows:
        b.add_row(r)
    conn.execute(_INSERT, (*key, chunk, *agg_values(b, len(rows))))


def rebuild(conn: sqlite3.Connection) -> int:
    """Rewrite every ``step_agg`` row from the ``steps`` table; returns how many."""
    keys = conn.execute("SELECT rid, rank, opt, chunk FROM step_agg").fetchall()
    conn.execute("BEGIN")
    for rid, rank, opt, c in keys:
        summarise(conn, (rid, rank, opt), c,
                  read_rows(conn, rid, rank, opt, c * db.CHUNK, (c + 1) * db.CHUNK - 1))
    conn.execute("COMMIT")
    return len(keys)


class ChunkSummaries:
    """Which chunk of each (rank, opt) of one run is open, and its rows so far.

    Args:
        rid: the run's row id.
        next_chunk: per (rank, opt), the first chunk without a summary (from ``series``).
        loaded: the run was stored before this process started, so rows of an open chunk
            may already be in the database.
    """

    def __init__(self, rid: int, next_chunk: dict[tuple[int, str], int] | None = None,
                 loaded: bool = False):
        self.rid = rid
        self.next_chunk = dict(next_chunk or {})
        self.loaded = loaded
        self._open: dict[tuple[int, str], tuple[int, list[Row], bool]] = {}
        """Per (rank, opt): the open chunk, its rows so far, and whether rows stored before
        a restart may be missing from them (then its summary is read from the database)."""

    def add(self, conn: sqlite3.Connection, rank: int, opt: str, rows: list[Row]) -> None:
        """Take the new rows of one (rank, opt); summarise the chunks they close."""
        key = (rank, opt)
        nxt = self.next_chunk.get(key)
        if nxt is None:
            conn.execute("INSERT OR IGNORE INTO series VALUES(?,?,?,0)", (self.rid, rank, opt))
            nxt = self.next_chunk[key] = 0
        redo: set[int] = set()
        closed: set[int] = set()
        for r in rows:
            c = r.step // db.CHUNK
            buf = self._open.get(key)
            if c < nxt or (buf is not None and c < buf[0]):
                redo.add(c)  # a resent gap in a summarised (or earlier) chunk
                continue
            if buf is not None and buf[0] == c:
                buf[1].append(r)
                continue
            if buf is not None:
                self._close(conn, key, *buf)
                closed.add(buf[0])
            self._open[key] = (c, [r], c == nxt and self.loaded)
        buf = self._open.get(key)
        top = buf[0] if buf is not None else nxt
        for c in sorted(redo | (set(range(nxt, top)) - closed)):
            if buf is None or c != buf[0]:
                self._close(conn, key, c, [], True)
        if top > nxt:
            self.next_chunk[key] = top
            conn.execute("UPDATE series SET next_chunk=? WHERE rid=? AND rank=? AND opt=?",
                         (top, self.rid, rank, opt))

    def _close(self, conn: sqlite3.Connection, key: tuple[int, str], c: int, rows: list[Row],
               from_db: bool) -> None:
        rank, opt = key
        if from_db:
            rows = read_rows(conn, self.rid, rank, opt, c * db.CHUNK, (c + 1) * db.CHUNK - 1)
        summarise(conn, (self.rid, rank, opt), c, rows)
