"""Step rows and their min/max downsampling, shared by storage queries and live fan-out.

A *row* is one step record in the columns of :class:`gradwatch.frames.StepSeries`. This
module is plain Python (no FastAPI, no SQLite): storage feeds it rows read from the
database, the fan-out feeds it rows of live batches when a client falls behind.

Downsampling keeps, per bucket of consecutive steps of one (rank, opt), the rows holding
the min and the max of ``norm`` and of ``drift`` (so spikes survive), the first row with a
finding fact (stale/leaked/late/discarded > 0, a skipped step, a non-finite norm) and the
first row whose resets differ from the bucket's usual ones: at most
:data:`ROWS_PER_BUCKET` rows.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from gradwatch.frames import StepSeries
from gradwatch.wire import Step

ROWS_PER_BUCKET = 6


class Row(NamedTuple):
    """One step row; norms are floats (NaN kept) or ``None`` when not sampled."""

    rank: int
    opt: str
    step: int
    t: float
    norm: float | None
    fresh_norm: float | None
    drift: float | None
    stale: int
    leaked: int
    late: int
    discarded: int
    skipped: bool
    resets: tuple[tuple[str, int], ...]


def row_from_step(s: Step, rank: int) -> Row:
    """The row of one step record."""
    return Row(rank, s.opt, s.step, s.t, s.norm, s.fresh_norm, s.drift, s.stale, s.leaked,
               len(s.late_params), s.discarded, s.skipped,
               tuple((r.how, len(r.params)) for r in s.resets))


def _odd_value(x: float | None) -> bool:
    return x is not None and not math.isfinite(x)


def is_flagged(r: Row) -> bool:
    """A row a plot must never lose: a finding fact, a skipped step or a non-finite norm."""
    return bool(r.stale or r.leaked or r.late or r.discarded or r.skipped
                or _odd_value(r.norm) or _odd_value(r.drift))


def reset_sig(r: Row) -> tuple[str, ...]:
    """The kinds of reset seen before a step (what "usual" compares)."""
    return tuple(sorted({how for how, _ in r.resets}))


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def _norm(r: Row) -> float:
    return r.norm or 0.0


def _drift(r: Row) -> float:
    return r.drift or 0.0


def pick_bucket(rows: Sequence[Row]) -> list[Row]:
    """The rows of one bucket worth keeping (see the module docstring), in step order."""
    if len(rows) <= ROWS_PER_BUCKET:
        return list(rows)
    keep: dict[int, Row] = {}
    norms = [r for r in rows if _finite(r.norm)]
    drifts = [r for r in rows if _finite(r.drift)]
    for r in (min(norms, key=_norm, default=None), max(norms, key=_norm, default=None),
              min(drifts, key=_drift, default=None), max(drifts, key=_drift, default=None)):
        if r is not None:
            keep[r.step] = r
    flagged = next((r for r in rows if is_flagged(r)), None)
    if flagged is not None:
        keep[flagged.step] = flagged
    usual = Counter(reset_sig(r) for r in rows).most_common(1)[0][0]
    odd = next((r for r in rows if reset_sig(r) != usual), None)
    if odd is not None:
        keep[odd.step] = odd
    if not keep:
        keep[rows[0].step] = rows[0]
    return [keep[k] for k in sorted(keep)]


def bucket_size(lo: int, hi: int, max_points: int) -> int:
    """Steps per bucket so that the buckets over [lo, hi] hold ≤ ``max_points`` rows."""
    n_buckets = max(1, max_points // ROWS_PER_BUCKET)
    return max(1, math.ceil((hi - lo + 1) / n_buckets))


def downsample(rows: Sequence[Row], max_points: int) -> tuple[list[Row], int]:
    """Downsample rows of any (rank, opt) mix to ≤ ``max_points`` rows per (rank, opt).

    Returns:
        The kept rows sorted by (rank, opt, step) and the bucket size used (1: untouched).
    """
    by_series: dict[tuple[int, str], list[Row]] = {}
    for r in rows:
        by_series.setdefault((r.rank, r.opt), []).append(r)
    out: list[Row] = []
    bucket = 1
    for key in sorted(by_series):
        rs = sorted(by_series[key], key=lambda r: r.step)
        if len(rs) <= max_points:
            out.extend(rs)
            continue
        b = bucket_size(rs[0].step, rs[-1].step, max_points)
        bucket = max(bucket, b)
        cur: list[Row] = []
        cur_k = rs[0].step // b
        for r in rs:
            k = r.step // b
            if k != cur_k:
                out.extend(pick_bucket(cur))
                cur, cur_k = [], k
            cur.append(r)
        out.extend(pick_bucket(cur))
    return out, bucket


def to_series(rows: Iterable[Row], bucket: int = 1, downsampled: bool = False,
              total: int | None = None) -> StepSeries:
    """Columnar :class:`StepSeries` of rows (already in the order wanted)."""
    cols: dict[str, list[Any]] = {k: [] for k in Row._fields}
    n = 0
    for r in rows:
        n += 1
        for k, v in zip(Row._fields, r, strict=True):
            cols[k].append(v)
    cols["resets"] = [[{"how": h, "n": c} for h, c in rs] for rs in cols["resets"]]
    return StepSeries.model_validate({**cols, "bucket": bucket, "downsampled": downsampled,
                                      "total": n if total is None else total})
