"""Step rows: one step record in the columns of a :class:`~gradwatch.frames.StepSeries`.

Also the rule of which rows a plot must never lose (:func:`must_keep`); downsampling, the
database's SQL form of it and the dashboard's copy (``web/js/series.js``) all follow this
function, and tests hold them to it. Plain Python: no FastAPI, no SQLite.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, NamedTuple

from gradwatch.verdict import FINDING_FACTS, carries_facts


class Row(NamedTuple):
    """One step row; norms are floats (NaN kept) or ``None`` when not sampled.

    Field names are the :class:`~gradwatch.frames.StepSeries` columns.
    """

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
    """Per reset kind seen before the step: (how, number of params it touched)."""
    loss: float | None = None
    """The step's loss (``Step.loss``); None when unknown."""
    lr: tuple[float | None, ...] | None = None
    """Each param group's learning rate (``Step.lr``); None when unknown."""


Scalar = tuple[int, str | None, int, str, float]
"""A value the user logged, as it goes live: (rank, opt, step, name, value)."""


class StepCols(NamedTuple):
    """One step record as stored columns (:func:`server.steptable.step_columns`), before the
    writer knows its series and reset-set id.

    The fields up to ``detail`` are the ``steps`` columns after ``sid``, in table order
    (:meth:`steps_values`); the rest go to ``reset_sets`` and ``param_norms``. A tuple, so
    it crosses from the parser processes in a batch cheaply.
    """

    step: int
    seq: int
    t: float
    norm: float | None
    """NULL (None) where the value was NaN: ``flags`` says so."""
    fresh_norm: float | None
    """None where NaN or where equal to ``norm`` (``flags`` says which)."""
    drift: float | None
    flags: int
    """``steptable.FLAG_*`` bits."""
    stale: int
    leaked: int
    late: int
    discarded: int
    backwards: int
    consumed: int
    fresh: int
    closure_evals: int
    rset: int | None
    """The ``reset_sets`` id: filled in by the writer (:meth:`with_rset`)."""
    loss: float | None
    lr: str | None
    """Learning rates, as JSON text."""
    detail: str | None
    """JSON of the step's fields no column holds."""
    resets: str | None
    """The ``reset_sets`` body (JSON), None for no resets."""
    summary: str | None
    """The ``reset_sets`` summary (``how:n;how:n``)."""
    params: bytes | str | None
    """Per-parameter norms, packed (``steptable.pack_norms``)."""
    pfresh: bytes | str | None
    """Per-parameter fresh norms, packed; None where equal to ``params``."""

    def steps_values(self, sid: int) -> tuple[Any, ...]:
        """The ``steps`` row of this step in series ``sid`` (``rset`` as filled in)."""
        return (sid, *self[:len(STEPS_COLUMNS)])

    def has_params(self) -> bool:
        """Whether the step carries per-parameter norms."""
        return self.params is not None or self.pfresh is not None


STEPS_COLUMNS = StepCols._fields[:StepCols._fields.index("detail") + 1]
"""The ``steps`` columns after ``sid``, in table order."""


KEEP_NONFINITE = ("norm", "drift")
"""Columns whose NaN or infinite value makes a row one to keep (a blow-up to see)."""

_facts = attrgetter(*FINDING_FACTS)
_measured = attrgetter(*KEEP_NONFINITE)


def _nonfinite(x: float | None) -> bool:
    return x is not None and not math.isfinite(x)


def must_keep(r: Row) -> bool:
    """Whether a plot must never lose this row, however it downsamples.

    True for a finding fact (:func:`gradwatch.verdict.carries_facts`), a skipped step, or a
    NaN or infinite ``norm`` or ``drift`` (:data:`KEEP_NONFINITE`).
    """
    return carries_facts(_facts(r)) or r.skipped or any(map(_nonfinite, _measured(r)))


def reset_sig(resets: Iterable[tuple[str, int]]) -> str:
    """A row's kinds of reset (its ``resets``), sorted and comma-joined ("" for none)."""
    return ",".join(sorted({how for how, _ in resets}))


@dataclass(frozen=True)
class SeriesRows:
    """Rows to send as one :class:`~gradwatch.frames.StepSeries` (sorted by rank, opt, step).

    Attributes:
        rows: the rows kept.
        bucket: steps per downsampling bucket (the largest over the series; 1: none).
        downsampled: whether rows were left out.
        total: rows before downsampling.
    """

    rows: list[Row]
    bucket: int = 1
    downsampled: bool = False
    total: int = 0

    def columns(self) -> dict[str, Any]:
        """The StepSeries fields, for :func:`gradwatch.frames.frame_json` (not validated)."""
        columns = ([list(c) for c in zip(*self.rows, strict=True)] if self.rows
                   else [[] for _ in Row._fields])
        cols: dict[str, Any] = dict(zip(Row._fields, columns, strict=True))
        cols["resets"] = [[{"how": h, "n": n} for h, n in rs] for rs in cols["resets"]]
        cols.update(bucket=self.bucket, downsampled=self.downsampled, total=self.total)
        return cols

