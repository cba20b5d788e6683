"""A validated ingest batch as storage takes it (:class:`Batch`), and what storing it
changed (:class:`IngestResult`).

Made once, where the frame was validated (:mod:`server.parsing`, possibly in a worker
process), and passed on as is: each record's JSON line to store, its step row for the
columns and the plots, and the validated record itself where the writer reads one
(headers, optimizers, stats, ends, and steps carrying a finding fact, the only steps the
:class:`~gradwatch.verdict.Verdict` turns into findings). Picklable for the parser
processes, where a record crosses as its JSON line only and is read back from it when
storage asks for it; steps without a finding fact, the bulk of a run, cross as the line and
a row of numbers.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from gradwatch.frames import OptimizerView, RunSummary
from gradwatch.server.rows import Row, Scalar, StepCols
from gradwatch.server.steptable import row_of, step_columns
from gradwatch.verdict import has_finding_facts
from gradwatch.wire import (
    AnyRecord,
    Finding,
    IngestBatch,
    Step,
    parse_record,
)

RecordModel = AnyRecord
RecordKind = Literal["header", "optimizer", "site", "step", "stats", "end", "unowned", "holding",
                     "scalars"]


class Entry:
    """One record of a batch.

    Attributes:
        seq, kind, t: the record's seq, type and time.
        body: the record as one JSON line (stored as is; ``None`` fields left out); for
            a step, only where it carries a finding fact ("" otherwise: its columns are
            what is stored).
        cols: its columns (:func:`server.steptable.step_columns`), for step records.
        where: (rank, optimizer) of a step record.
    """

    __slots__ = ("seq", "kind", "t", "body", "cols", "where", "_row", "_record", "_in_body")

    def __init__(self, seq: int, kind: RecordKind, t: float, body: str,
                 record: RecordModel | None, in_body: bool = False,
                 cols: StepCols | None = None, where: tuple[int, str] | None = None):
        self.seq, self.kind, self.t, self.body = seq, kind, t, body
        self.cols, self.where = cols, where
        self._row: Row | None = None
        self._record = record
        self._in_body = in_body

    @property
    def row(self) -> Row | None:
        """Its step row (for step records), made from its columns where it is first read:
        on the storage writer, so a parser process neither builds nor sends one."""
        if self._row is None and self.cols is not None and self.where is not None:
            self._row = row_of(*self.where, self.cols)
        return self._row

    @property
    def record(self) -> RecordModel | None:
        """The validated record, except for steps without a finding fact (``None``)."""
        # After crossing a process boundary: read back from the line, and not kept, so a
        # stored batch of flagged steps holds no model per step for the garbage collector.
        return parse_record(self.body, 1) if self._in_body else self._record

    def __reduce__(self) -> tuple[type[Entry], tuple[Any, ...]]:
        # Across the parser processes' boundary a record travels as its JSON line only: a
        # line pickles for almost nothing, a model costs about what parsing it again does.
        return Entry, (self.seq, self.kind, self.t, self.body, None,
                       self._in_body or self._record is not None, self.cols, self.where)


class Batch(NamedTuple):
    """A validated batch of one (run, rank) stream."""

    run: str
    rank: int
    entries: list[Entry]


def entry(r: RecordModel, rank: int) -> Entry:
    """The :class:`Entry` of one validated record."""
    if isinstance(r, Step):
        flagged = has_finding_facts(r)
        body = _json(r) if flagged else ""
        return Entry(r.seq, "step", r.t, body, r if flagged else None,
                     cols=step_columns(r), where=(rank, r.opt))
    return Entry(r.seq, r.type, r.t, _json(r), r)


def _json(r: RecordModel) -> str:
    return r.__pydantic_serializer__.to_json(r, exclude_none=True).decode()


def batch_of(frame: IngestBatch) -> Batch:
    """The batch of a validated ingest frame."""
    return Batch(frame.run, frame.rank, [entry(r, frame.rank) for r in frame.records])


def batch_of_records(run: str, rank: int, records: Iterable[RecordModel]) -> Batch:
    """The batch of validated records (an imported step log)."""
    return Batch(run, rank, [entry(r, rank) for r in records])


@dataclass
class IngestResult:
    """What one stored batch changed, for the ack and the live fan-out."""

    run: str
    rank: int
    ack: int
    """Highest seq stored of the stream (every record up to it is stored); -1: none."""
    new_run: bool = False
    stored: int = 0
    """Records new to the database."""
    rows: list[Row] = field(default_factory=list)
    """Step rows new to the database."""
    optimizers: list[OptimizerView] = field(default_factory=list)
    findings: list[Finding] | None = None
    """The run's findings, when the batch changed them."""
    summary: RunSummary | None = None
    scalars: list[Scalar] = field(default_factory=list)
    """Values new to the database from ``Scalars`` records: (rank, opt, step, name,
    value)."""
