"""Downsampled reads of long series without scanning them.

A million-step series is never read whole: its extent comes from two index lookups, its
row count and per-bucket extremes from the ``step_agg`` chunk summaries (one row per
:data:`~gradwatch.server.db.CHUNK` steps), and only the edges not covered by whole
chunks are read row by row, as light tuples. Then just the kept rows are fetched whole.
"""

from __future__ import annotations

import math
import sqlite3
from typing import Any

from gradwatch.server import db
from gradwatch.server.series import Row, bucket_size
from gradwatch.server.writes import STEP_SELECT, read_rows, to_row

_KEY = "WHERE rid=? AND rank=? AND opt=? AND step BETWEEN ? AND ?"
_LIGHT = ("SELECT step, norm, drift, nan, stale + leaked + late + discarded + skipped, "
          "resets FROM steps " + _KEY + " ORDER BY step")
_AGG = ("SELECT chunk, mn_norm, mn_norm_step, mx_norm, mx_norm_step, mn_drift, mn_drift_step, "
        "mx_drift, mx_drift_step, flag_step, odd_step FROM step_agg WHERE rid=? AND rank=? "
        "AND opt=? AND chunk BETWEEN ? AND ?")
Cands = dict[int, dict[str, tuple[float, int]]]


def span(c: sqlite3.Connection, table: str, key: tuple[Any, ...]) -> tuple[int, int] | None:
    """First and last step of ``table`` rows matching ``key`` (rid, rank, opt, lo, hi)."""
    first = c.execute(f"SELECT step FROM {table} {_KEY} ORDER BY step LIMIT 1", key).fetchone()
    if first is None:
        return None
    last = c.execute(f"SELECT step FROM {table} {_KEY} ORDER BY step DESC LIMIT 1",
                     key).fetchone()
    return int(first[0]), int(last[0])


def _chunks(smin: int, smax: int, next_chunk: int) -> tuple[int, int]:
    """Whole, summarised chunks inside [smin, smax] (empty when hi < lo)."""
    return -(-smin // db.CHUNK), min(next_chunk - 1, (smax + 1) // db.CHUNK - 1)


def _edges(smin: int, smax: int, c_lo: int, c_hi: int) -> list[tuple[int, int]]:
    if c_hi < c_lo:
        return [(smin, smax)]
    return [(smin, c_lo * db.CHUNK - 1), ((c_hi + 1) * db.CHUNK, smax)]


def count(c: sqlite3.Connection, rid: int, rank: int, opt: str, smin: int, smax: int,
          next_chunk: int) -> int:
    """Step rows in [smin, smax], from chunk summaries plus the edges."""
    c_lo, c_hi = _chunks(smin, smax, next_chunk)
    n = 0
    if c_hi >= c_lo:
        n = c.execute("SELECT coalesce(sum(n), 0) FROM step_agg WHERE rid=? AND rank=? AND "
                      "opt=? AND chunk BETWEEN ? AND ?", (rid, rank, opt, c_lo, c_hi)
                      ).fetchone()[0]
    for r0, r1 in _edges(smin, smax, c_lo, c_hi):
        if r1 >= r0:
            n += c.execute(f"SELECT count(*) FROM steps {_KEY}",
                           (rid, rank, opt, r0, r1)).fetchone()[0]
    return int(n)


def _plan(smin: int, smax: int, b: int, next_chunk: int
          ) -> tuple[int, int, int, list[tuple[int, int]]]:
    """Bucket size, summarised chunks to use and raw ranges to scan for [smin, smax].

    Buckets of at least a chunk are rounded to whole chunks, so they read the chunk
    summaries; only the edges outside whole chunks are scanned row by row.
    """
    if b < db.CHUNK:
        return b, 0, -1, [(smin, smax)]
    b = math.ceil(b / db.CHUNK) * db.CHUNK
    c_lo, c_hi = _chunks(smin, smax, next_chunk)
    return b, c_lo, c_hi, _edges(smin, smax, c_lo, c_hi)


def _better(d: dict[str, tuple[float, int]], name: str, key: float, step: int) -> None:
    cur = d.get(name)
    if cur is None or key < cur[0]:
        d[name] = (key, step)


def series_rows(c: sqlite3.Connection, rid: int, rank: int, opt: str, lo: int, hi: int,
                max_points: int, next_chunk: int) -> tuple[list[Row], int, int]:
    """Rows of one (rank, opt) in [lo, hi], downsampled; with bucket size and total."""
    sp = span(c, "steps", (rid, rank, opt, lo, hi))
    if sp is None:
        return [], 1, 0
    smin, smax = sp
    n = smax - smin + 1
    if n > max_points:
        n = count(c, rid, rank, opt, smin, smax, next_chunk)
    if n <= max_points:
        every = read_rows(c, rid, rank, opt, smin, smax)
        return every, 1, len(every)
    cands: Cands = {}
    b, c_lo, c_hi, ranges = _plan(smin, smax, bucket_size(smin, smax, max_points), next_chunk)
    if c_hi >= c_lo:
        for a in c.execute(_AGG, (rid, rank, opt, c_lo, c_hi)):
            d = cands.setdefault(a[0] * db.CHUNK // b, {})
            for name, i, sign in (("mn_norm", 1, 1), ("mx_norm", 3, -1),
                                  ("mn_drift", 5, 1), ("mx_drift", 7, -1)):
                if a[i] is not None:
                    _better(d, name, sign * a[i], a[i + 1])
            for name, i in (("flag", 9), ("odd", 10)):
                if a[i] is not None:
                    _better(d, name, a[i], a[i])
    for r0, r1 in ranges:
        if r1 >= r0:
            _scan(c, (rid, rank, opt, r0, r1), b, cands)
    # The span's ends are always kept, so a downsampled chart reaches the run's last step.
    keep = sorted({smin, smax} | {s for d in cands.values() for _, s in d.values()})
    rows: list[Row] = []
    for i in range(0, len(keep), 900):
        part = keep[i:i + 900]
        rows += [to_row(t) for t in c.execute(
            STEP_SELECT + f"WHERE rid=? AND rank=? AND opt=? AND step IN "
                          f"({','.join('?' * len(part))}) ORDER BY step",
            (rid, rank, opt, *part))]
    return rows, b, n


def _scan(c: sqlite3.Connection, key: tuple[Any, ...], b: int, cands: Cands) -> None:
    """Bucket extremes of raw rows (light tuples: no Row objects for rows not kept)."""
    usual: dict[int, str | None] = {}
    for step, norm, drift, nan, facts, resets in c.execute(_LIGHT, key):
        k = step // b
        d = cands.get(k)
        if d is None:
            d = cands[k] = {}
        for name, v in (("norm", norm), ("drift", drift)):
            if v is None:
                continue
            if math.isfinite(v):
                _better(d, "mn_" + name, v, step)
                _better(d, "mx_" + name, -v, step)
            else:
                facts = 1  # a NaN/Inf step is kept like a finding fact
        if facts or nan:
            _better(d, "flag", step, step)
        hows = resets and ",".join(p.partition(":")[0] for p in resets.split(";"))
        if usual.setdefault(k, hows) != hows:
            _better(d, "odd", step, step)


def param_steps(c: sqlite3.Connection, rid: int, rank: int, opt: str, lo: int, hi: int,
                max_points: int, next_chunk: int) -> tuple[list[int] | None, int]:
    """Steps to show of a per-parameter series: per bucket, the step of largest norm.

    Returns ``(None, 1)`` when every step in range fits (read them all).
    """
    sp = span(c, "steps", (rid, rank, opt, lo, hi))
    if sp is None:
        return [], 1
    smin, smax = sp
    b = math.ceil((smax - smin + 1) / max_points)
    if b <= 1:
        return None, 1
    best: dict[int, tuple[float, int]] = {}
    b, c_lo, c_hi, ranges = _plan(smin, smax, b, next_chunk)
    if c_hi >= c_lo:
        for chunk, mx, step in c.execute(
                "SELECT chunk, mx_norm, mx_norm_step FROM step_agg WHERE rid=? AND rank=? "
                "AND opt=? AND chunk BETWEEN ? AND ? AND mx_norm IS NOT NULL",
                (rid, rank, opt, c_lo, c_hi)):
            k = chunk * db.CHUNK // b
            if k not in best or mx > best[k][0]:
                best[k] = (mx, step)
    for r0, r1 in ranges:
        if r1 < r0:
            continue
        # SQLite fills the bare column ``step`` from the row holding the max()
        for k, step, total in c.execute(
                f"SELECT step / ?, step, max(coalesce(norm, -1)) FROM steps {_KEY} "
                f"GROUP BY step / ?", (b, rid, rank, opt, r0, r1, b)):
            if k not in best or total > best[k][0]:
                best[k] = (total, step)
    return sorted(s for _, s in best.values()), b
