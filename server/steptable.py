"""The ``steps`` and ``step_agg`` columns: how rows and bucket summaries are stored and read.

Shared by the writer (:mod:`server.writes`, :mod:`server.chunks`) and the readers
(:mod:`server.reader`, :mod:`server.series_read`); it imports neither. The SQL forms of
the row rules are generated here from their Python homes and tests hold them equal:
:data:`FACTS_SQL` (:func:`gradwatch.verdict.carries_facts`) and :data:`MUST_KEEP_SQL`
(:func:`server.rows.must_keep`).
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from gradwatch.server.downsampling import Bucket
from gradwatch.server.rows import KEEP_NONFINITE, Row
from gradwatch.verdict import FINDING_FACTS

# SQLite stores NaN as NULL: a bit per norm column says "this NULL was a NaN".
NAN_BITS = {"norm": 1, "fresh_norm": 2, "drift": 4, "loss": 8}
_NORM, _FRESH, _DRIFT = NAN_BITS["norm"], NAN_BITS["fresh_norm"], NAN_BITS["drift"]
_LOSS = NAN_BITS["loss"]
_NAN = float("nan")

STEP_SELECT = ("SELECT rank, opt, step, t, norm, fresh_norm, drift, nan, stale, leaked, "
               "late, discarded, skipped, resets, loss, lr FROM steps ")
"""Reads rows for :func:`to_row`; append the WHERE clause."""

FACTS_SQL = "(" + " OR ".join(f"{c} > 0" for c in FINDING_FACTS) + ")"
"""A ``steps`` row carries a finding fact."""

MUST_KEEP_SQL = "(" + " OR ".join(
    [FACTS_SQL, "skipped"] + [f"nan & {NAN_BITS[c]} OR abs({c}) = 9e999"
                              for c in KEEP_NONFINITE]) + ")"
"""A ``steps`` row a plot must never lose (``9e999`` is SQLite's infinity)."""


def step_values(rid: int, seq: int, r: Row) -> tuple[Any, ...]:
    """The ``steps`` table values of one row, in column order."""
    nan = ((r.norm != r.norm) * _NORM | (r.fresh_norm != r.fresh_norm) * _FRESH
           | (r.drift != r.drift) * _DRIFT | (r.loss != r.loss) * _LOSS)
    resets = ";".join([f"{how}:{n}" for how, n in r.resets]) or None
    lr = None if r.lr is None else json.dumps(r.lr, separators=(",", ":"))
    return (rid, r.rank, r.opt, r.step, seq, r.t, r.norm, r.fresh_norm, r.drift, nan,
            r.stale, r.leaked, r.late, r.discarded, int(r.skipped), resets, r.loss, lr)


def to_row(t: tuple[Any, ...]) -> Row:
    """A row as :data:`STEP_SELECT` reads it, as a :class:`Row` (NaN restored)."""
    nan = t[7]
    return Row(t[0], t[1], t[2], t[3],
               _NAN if nan & _NORM else t[4],
               _NAN if nan & _FRESH else t[5],
               _NAN if nan & _DRIFT else t[6],
               t[8], t[9], t[10], t[11], bool(t[12]),
               resets_of(t[13]), _NAN if nan & _LOSS else t[14],
               None if t[15] is None else tuple(json.loads(t[15])))


def resets_of(text: str | None) -> tuple[tuple[str, int], ...]:
    """The ``resets`` column (``how:n;how:n``) as (how, n) pairs."""
    if not text:
        return ()
    out = []
    for part in text.split(";"):
        how, _, n = part.partition(":")
        out.append((how, int(n)))
    return tuple(out)


def read_rows(conn: sqlite3.Connection, rid: int, rank: int, opt: str, lo: int,
              hi: int) -> list[Row]:
    """Step rows of one (rank, opt) with ``lo <= step <= hi``, in step order."""
    cur = conn.execute(STEP_SELECT + "WHERE rid=? AND rank=? AND opt=? AND step BETWEEN ? "
                       "AND ? ORDER BY step", (rid, rank, opt, lo, hi))
    return [to_row(t) for t in cur]


AGG_SELECT = ("SELECT chunk, mn_norm, mn_norm_step, mx_norm, mx_norm_step, mn_drift, "
              "mn_drift_step, mx_drift, mx_drift_step, flag_step, sig FROM step_agg ")
"""Reads chunk summaries for :func:`bucket_of`; append the WHERE clause."""


def agg_values(b: Bucket, n: int) -> tuple[Any, ...]:
    """The ``step_agg`` values after the key (rid, rank, opt, chunk) of a chunk's bucket."""
    out: list[Any] = [n]
    for x in (b.lo_norm, b.hi_norm, b.lo_drift, b.hi_drift):
        out += [None, None] if x is None else list(x)
    return (*out, b.flag, b.odd(), json.dumps(b.sigs, separators=(",", ":")))


def bucket_of(t: tuple[Any, ...]) -> tuple[int, Bucket]:
    """A chunk summary as :data:`AGG_SELECT` reads it: its chunk and its bucket."""
    b = Bucket()
    b.lo_norm = None if t[1] is None else (t[1], t[2])
    b.hi_norm = None if t[3] is None else (t[3], t[4])
    b.lo_drift = None if t[5] is None else (t[5], t[6])
    b.hi_drift = None if t[7] is None else (t[7], t[8])
    b.flag = t[9]
    b.sigs = json.loads(t[10])
    return t[0], b
