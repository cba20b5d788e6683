"""Downsampled reads of stored series, by the rule of :mod:`server.downsampling`.

A long series is never read whole: its extent comes from two index lookups, its row count
and the buckets from the ``step_agg`` chunk summaries (one per
:data:`~server.db.CHUNK` steps), and only the edges not covered by whole summarised chunks
are read row by row, as light tuples. Then just the kept rows are fetched whole. The
answer is exactly :func:`server.downsampling.downsample` of the rows with
``align=CHUNK`` (tests compare the two).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from gradwatch.server import db
from gradwatch.server.downsampling import Bucket, aligned, bucket_size
from gradwatch.server.rows import Row, reset_sig
from gradwatch.server.steptable import (
    AGG_SELECT,
    MUST_KEEP_SQL,
    STEP_SELECT,
    bucket_of,
    read_rows,
    resets_of,
    to_row,
)

if TYPE_CHECKING:
    from gradwatch.server.backend import Conn

_KEY = "WHERE sid=? AND step BETWEEN ? AND ?"
Key = tuple[int, int, int]
"""(sid, lo, hi): one series' steps in [lo, hi], as :data:`_KEY` takes them."""
BUCKET_MAX = ("SELECT k, step, max(v) FROM (SELECT step / ? AS k, step, "
              f"coalesce(norm, -1) AS v FROM steps {_KEY}) GROUP BY k")
"""Per bucket of ``b`` steps, the largest norm and its step (the first such step on ties:
SQLite fills the bare column ``step`` from the first row holding the max)."""
SPAN = "SELECT step FROM {table} " + _KEY + " ORDER BY step{order} LIMIT 1"
"""The first (``order`` "") or last (" DESC") step of ``table`` rows matching a key."""
_LIGHT = (f"SELECT step, norm, drift, {MUST_KEEP_SQL}, rset FROM steps {_KEY} "
          f"ORDER BY step")


def span(c: Conn, table: str, key: Key) -> tuple[int, int] | None:
    """First and last step of ``table`` rows matching ``key`` (sid, lo, hi)."""
    first = c.execute(SPAN.format(table=table, order=""), key).fetchone()
    if first is None:
        return None
    last = c.execute(SPAN.format(table=table, order=" DESC"), key).fetchone()
    return int(first[0]), int(last[0])


def _chunks(smin: int, smax: int, next_chunk: int) -> tuple[int, int]:
    """Whole, summarised chunks inside [smin, smax] (empty when hi < lo)."""
    return -(-smin // db.CHUNK), min(next_chunk - 1, (smax + 1) // db.CHUNK - 1)


def _edges(smin: int, smax: int, c_lo: int, c_hi: int) -> list[tuple[int, int]]:
    if c_hi < c_lo:
        return [(smin, smax)]
    return [(smin, c_lo * db.CHUNK - 1), ((c_hi + 1) * db.CHUNK, smax)]


def count(c: Conn, sid: int, smin: int, smax: int, next_chunk: int) -> int:
    """Step rows in [smin, smax], from chunk summaries plus the edges."""
    c_lo, c_hi = _chunks(smin, smax, next_chunk)
    n = 0
    if c_hi >= c_lo:
        n = c.execute("SELECT coalesce(sum(n), 0) FROM step_agg WHERE sid=? AND chunk "
                      "BETWEEN ? AND ?", (sid, c_lo, c_hi)).fetchone()[0]
    for r0, r1 in _edges(smin, smax, c_lo, c_hi):
        if r1 >= r0:
            n += c.execute(f"SELECT count(*) FROM steps {_KEY}",
                           (sid, r0, r1)).fetchone()[0]
    return int(n)


def _plan(smin: int, smax: int, b: int, next_chunk: int
          ) -> tuple[int, int, list[tuple[int, int]]]:
    """Summarised chunks to use and raw ranges to scan for buckets of ``b`` over [smin, smax].

    Buckets of at least a chunk are whole chunks (``bucket_size(align=CHUNK)``), so they
    read the chunk summaries; only the edges outside whole summarised chunks are scanned.
    """
    if b < db.CHUNK:
        return 0, -1, [(smin, smax)]
    c_lo, c_hi = _chunks(smin, smax, next_chunk)
    return c_lo, c_hi, _edges(smin, smax, c_lo, c_hi)


def series_rows(c: Conn, sid: int, lo: int, hi: int, max_points: int,
                next_chunk: int) -> tuple[list[Row], int, int]:
    """Rows of one series in [lo, hi], downsampled; with bucket size and total."""
    sp = span(c, "steps", (sid, lo, hi))
    if sp is None:
        return [], 1, 0
    smin, smax = sp
    n = smax - smin + 1
    if n > max_points:
        n = count(c, sid, smin, smax, next_chunk)
    if n <= max_points:
        every = read_rows(c, sid, smin, smax)
        return every, 1, len(every)
    b = bucket_size(smin, smax, max_points, align=db.CHUNK)
    c_lo, c_hi, ranges = _plan(smin, smax, b, next_chunk)
    buckets: dict[int, Bucket] = {}
    if c_hi >= c_lo:
        for t in c.execute(AGG_SELECT + "WHERE sid=? AND chunk BETWEEN ? AND ?",
                           (sid, c_lo, c_hi)):
            chunk, part = bucket_of(t)
            _bucket(buckets, chunk * db.CHUNK // b).merge(part)
    for r0, r1 in ranges:
        if r1 >= r0:
            _scan(c, (sid, r0, r1), b, buckets)
    keep = sorted({smin, smax}.union(*(k.kept() for k in buckets.values())))
    rows: list[Row] = []
    for i in range(0, len(keep), 900):
        part_steps = keep[i:i + 900]
        rows += [to_row(t) for t in c.execute(
            STEP_SELECT + f"WHERE s.sid=? AND s.step IN "
                          f"({','.join('?' * len(part_steps))}) ORDER BY s.step",
            (sid, *part_steps))]
    return rows, b, n


def _bucket(buckets: dict[int, Bucket], k: int) -> Bucket:
    b = buckets.get(k)
    if b is None:
        b = buckets[k] = Bucket()
    return b


def _scan(c: Conn, key: Key, b: int,
          buckets: dict[int, Bucket]) -> None:
    """Count raw rows into their buckets (light tuples: no Row objects for rows not kept)."""
    sigs: dict[int | None, str] = {}
    for step, norm, drift, keep, rset in c.execute(_LIGHT, key):
        sig = sigs.get(rset)
        if sig is None:  # once per distinct reset set
            text = None if rset is None else c.execute(
                "SELECT summary FROM reset_sets WHERE id=?", (rset,)).fetchone()[0]
            sig = sigs[rset] = reset_sig(resets_of(text))
        _bucket(buckets, step // b).add(step, norm, drift, bool(keep), sig)


def param_steps(c: Conn, sid: int, lo: int, hi: int, max_points: int,
                next_chunk: int) -> tuple[list[int] | None, int]:
    """Steps to show of a per-parameter series: per bucket, the step of largest norm.

    Returns ``(None, 1)`` when every step in range fits (read them all).
    """
    sp = span(c, "param_norms", (sid, lo, hi))
    if sp is None:
        return [], 1
    smin, smax = sp
    b = math.ceil((smax - smin + 1) / max_points)
    if b <= 1:
        return None, 1
    best: dict[int, tuple[float, int]] = {}
    b = aligned(b, db.CHUNK)
    c_lo, c_hi, ranges = _plan(smin, smax, b, next_chunk)
    if c_hi >= c_lo:
        for chunk, mx, step in c.execute(
                "SELECT chunk, mx_norm, mx_norm_step FROM step_agg WHERE sid=? "
                "AND chunk BETWEEN ? AND ? AND mx_norm IS NOT NULL", (sid, c_lo, c_hi)):
            k = chunk * db.CHUNK // b
            if k not in best or mx > best[k][0]:
                best[k] = (mx, step)
    for r0, r1 in ranges:
        if r1 < r0:
            continue
        for k, step, total in c.execute(BUCKET_MAX, (b, sid, r0, r1)):
            if k not in best or total > best[k][0]:
                best[k] = (total, step)
    return sorted(s for _, s in best.values()), b
