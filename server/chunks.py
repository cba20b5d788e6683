"""Chunk summaries (``step_agg``) of a run's series, written on the storage writer thread.

Every :data:`~server.db.CHUNK` consecutive steps of one series get one ``step_agg`` row:
the downsampling :class:`~server.downsampling.Bucket` of those steps. Steps of a series
arrive in order, so a chunk is summarised once a row of a later chunk arrives; the rows of
the open chunk are kept in memory, or read back from the database when rows stored before
a restart, or a resent gap, belong to it. Only chunks that hold rows are ever visited, so
a jump in step numbers (a step 10**15 after step 200) costs nothing.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from gradwatch.server import db
from gradwatch.server.downsampling import Bucket
from gradwatch.server.rows import Row
from gradwatch.server.steptable import AGG_INSERT, agg_values, read_rows

if TYPE_CHECKING:
    from gradwatch.server.backend import Conn

log = logging.getLogger(__name__)


def summarise(conn: Conn, sid: int, chunk: int, rows: list[Row]) -> None:
    """Write the ``step_agg`` row of one chunk of series ``sid`` from its rows."""
    if not rows:
        return
    b = Bucket()
    for r in rows:
        b.add_row(r)
    conn.execute(AGG_INSERT, (sid, chunk, *agg_values(b, len(rows))))


def rebuild(conn: Conn) -> int:
    """Rewrite every ``step_agg`` row from the ``steps`` table (inside the caller's
    transaction); returns how many."""
    keys = conn.execute("SELECT sid, chunk FROM step_agg").fetchall()
    for sid, c in keys:
        summarise(conn, sid, c, read_rows(conn, sid, c * db.CHUNK, (c + 1) * db.CHUNK - 1))
    return len(keys)


class ChunkSummaries:
    """Which chunk of each series of one run is open, and its rows so far.

    Args:
        loaded: the run was stored before this process started, so rows of an open chunk
            may already be in the database.
    """

    def __init__(self, loaded: bool = False):
        self.next_chunk: dict[int, int] = {}
        """Per series: the first chunk without a summary (from ``series``)."""
        self.loaded = loaded
        self._open: dict[int, tuple[int, list[Row], bool]] = {}
        """Per series: the open chunk, its rows so far, and whether rows stored before
        a restart may be missing from them (then its summary is read from the database)."""

    def add(self, conn: Conn, sid: int, rows: list[Row]) -> None:
        """Take the new rows of one series; summarise the chunks they close."""
        nxt = self.next_chunk.setdefault(sid, 0)
        redo: set[int] = set()
        for r in rows:
            c = r.step // db.CHUNK
            buf = self._open.get(sid)
            if c < nxt or (buf is not None and c < buf[0]):
                redo.add(c)  # a resent gap in a summarised (or earlier) chunk
                continue
            if buf is not None and buf[0] == c:
                buf[1].append(r)
                continue
            if buf is not None:
                self._close(conn, sid, *buf)
            elif self.loaded and c > nxt:
                # After a restart the chunk that was open may hold stored rows.
                self._close(conn, sid, nxt, [], True)
            self._open[sid] = (c, [r], c == nxt and self.loaded)
        buf = self._open.get(sid)
        for c in sorted(redo):
            if buf is None or c != buf[0]:
                self._close(conn, sid, c, [], True)
        top = buf[0] if buf is not None else nxt
        if top > nxt:
            self.next_chunk[sid] = top
            conn.execute("UPDATE series SET next_chunk=? WHERE sid=?", (top, sid))

    def _close(self, conn: Conn, sid: int, c: int, rows: list[Row],
               from_db: bool) -> None:
        if from_db:
            rows = read_rows(conn, sid, c * db.CHUNK, (c + 1) * db.CHUNK - 1)
        summarise(conn, sid, c, rows)
