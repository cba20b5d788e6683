"""Min/max downsampling of step rows: the one rule, for live frames and stored series.

A series of one (rank, opt) with more rows than ``max_points`` is cut into buckets of
:func:`bucket_size` steps (bucket ``k`` holds the steps with ``step // size == k``). Each
bucket keeps at most :data:`ROWS_PER_BUCKET` rows:

- the rows holding the min and the max finite ``norm`` and the min and the max finite
  ``drift``, so spikes survive (on a tie, the earliest step);
- the first row a plot must never lose (:func:`server.rows.must_keep`);
- the first row whose reset kinds differ from the bucket's usual ones (the kinds most of
  its rows have; on a tie, those seen first).

The series' first and last rows are always kept, so a chart spans the whole range.

:class:`Bucket` holds what a bucket keeps so far; buckets of rows merge, which is how the
database answers from per-chunk summaries (:mod:`server.chunks`, :mod:`server.series_read`)
exactly what :func:`downsample` answers from the rows themselves. The dashboard's copy of
the rule (``web/js/series.js``) is tested against the same fixture.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from gradwatch.server.rows import Row, must_keep, reset_sig

ROWS_PER_BUCKET = 6

Extreme = tuple[float, int]
"""A value and the step holding it."""


def bucket_size(lo: int, hi: int, max_points: int, align: int = 1) -> int:
    """Steps per bucket so that the buckets over [lo, hi] keep at most ``max_points`` rows.

    Args:
        align: a bucket of at least this many steps is rounded up to a multiple of it (the
            database's chunk size, so that whole chunk summaries fall in one bucket).
    """
    return aligned(max(1, math.ceil((hi - lo + 1) / max(1, max_points // ROWS_PER_BUCKET))),
                   align)


def aligned(size: int, align: int) -> int:
    """``size`` rounded up to a multiple of ``align`` when it is at least ``align``."""
    return math.ceil(size / align) * align if align > 1 and size >= align else size


def _lower(cur: Extreme | None, v: float, step: int) -> bool:
    return cur is None or v < cur[0] or (v == cur[0] and step < cur[1])


def _higher(cur: Extreme | None, v: float, step: int) -> bool:
    return cur is None or v > cur[0] or (v == cur[0] and step < cur[1])


class Bucket:
    """What one bucket keeps, from rows added in any order or from merged buckets.

    Attributes:
        lo_norm, hi_norm, lo_drift, hi_drift: min/max finite value and its step, or None.
        flag: the first step that must be kept, or None.
        sigs: per reset signature (:func:`server.rows.reset_sig`): [rows, first step].
    """

    __slots__ = ("lo_norm", "hi_norm", "lo_drift", "hi_drift", "flag", "sigs")

    def __init__(self) -> None:
        self.lo_norm: Extreme | None = None
        self.hi_norm: Extreme | None = None
        self.lo_drift: Extreme | None = None
        self.hi_drift: Extreme | None = None
        self.flag: int | None = None
        self.sigs: dict[str, list[int]] = {}

    def add(self, step: int, norm: float | None, drift: float | None, keep: bool,
            sig: str) -> None:
        """Count one row: its step, norm, drift, :func:`must_keep` and reset signature."""
        if norm is not None and math.isfinite(norm):
            if _lower(self.lo_norm, norm, step):
                self.lo_norm = (norm, step)
            if _higher(self.hi_norm, norm, step):
                self.hi_norm = (norm, step)
        if drift is not None and math.isfinite(drift):
            if _lower(self.lo_drift, drift, step):
                self.lo_drift = (drift, step)
            if _higher(self.hi_drift, drift, step):
                self.hi_drift = (drift, step)
        if keep and (self.flag is None or step < self.flag):
            self.flag = step
        seen = self.sigs.get(sig)
        if seen is None:
            self.sigs[sig] = [1, step]
        else:
            seen[0] += 1
            if step < seen[1]:
                seen[1] = step

    def add_row(self, r: Row) -> None:
        """Count one row."""
        self.add(r.step, r.norm, r.drift, must_keep(r), reset_sig(r.resets))

    def merge(self, other: Bucket) -> None:
        """Count every row ``other`` counted (a bucket of disjoint rows)."""
        if other.lo_norm is not None and _lower(self.lo_norm, *other.lo_norm):
            self.lo_norm = other.lo_norm
        if other.hi_norm is not None and _higher(self.hi_norm, *other.hi_norm):
            self.hi_norm = other.hi_norm
        if other.lo_drift is not None and _lower(self.lo_drift, *other.lo_drift):
            self.lo_drift = other.lo_drift
        if other.hi_drift is not None and _higher(self.hi_drift, *other.hi_drift):
            self.hi_drift = other.hi_drift
        if other.flag is not None and (self.flag is None or other.flag < self.flag):
            self.flag = other.flag
        for sig, (n, first) in other.sigs.items():
            seen = self.sigs.get(sig)
            if seen is None:
                self.sigs[sig] = [n, first]
            else:
                seen[0] += n
                seen[1] = min(seen[1], first)

    def odd(self) -> int | None:
        """The first step whose reset kinds differ from the bucket's usual ones."""
        if len(self.sigs) < 2:
            return None
        usual = max(self.sigs, key=lambda s: (self.sigs[s][0], -self.sigs[s][1]))
        return min(first for sig, (_, first) in self.sigs.items() if sig != usual)

    def kept(self) -> set[int]:
        """The steps this bucket keeps."""
        out = {x[1] for x in (self.lo_norm, self.hi_norm, self.lo_drift, self.hi_drift)
               if x is not None}
        for step in (self.flag, self.odd()):
            if step is not None:
                out.add(step)
        return out


def downsample(rows: Iterable[Row], max_points: int, align: int = 1
               ) -> tuple[list[Row], int]:
    """Downsample rows of any (rank, opt) mix to at most ``max_points`` rows per series.

    Args:
        align: see :func:`bucket_size`.
    Returns:
        The kept rows sorted by (rank, opt, step), and the largest bucket size used (1:
        nothing left out).
    """
    by_series: dict[tuple[int, str], list[Row]] = {}
    for r in rows:
        by_series.setdefault((r.rank, r.opt), []).append(r)
    out: list[Row] = []
    largest = 1
    for key in sorted(by_series):
        rs = sorted(by_series[key], key=lambda r: r.step)
        if len(rs) <= max_points:
            out.extend(rs)
            continue
        size = bucket_size(rs[0].step, rs[-1].step, max_points, align)
        largest = max(largest, size)
        buckets: dict[int, Bucket] = {}
        for r in rs:
            b = buckets.get(r.step // size)
            if b is None:
                b = buckets[r.step // size] = Bucket()
            b.add_row(r)
        keep = {rs[0].step, rs[-1].step}.union(*(b.kept() for b in buckets.values()))
        out.extend(r for r in rs if r.step in keep)
    return out, largest
