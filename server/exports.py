"""Exports: a stored run as a step log (one rank) or as CSV of its step rows, streamed.

A step log's header carries the run's notes and tags as they are now (``Header.notes``,
``Header.tags``), so an import of it keeps them.

Step records are rebuilt from their columns (:func:`server.steptable.step_record`), equal
in meaning to the records received, and written at today's version. Each export reads in
one transaction of its own connection, so it sees one state of the run however long the
client takes. Called from a worker thread; plain module: no FastAPI.
"""

from __future__ import annotations

import csv
import heapq
import io
import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from gradwatch.server.rows import Row
from gradwatch.server.steptable import RECORD_SELECT, STEP_SELECT, step_record, to_row
from gradwatch.wire import Header, Scalars, Step, parse_record
from gradwatch.wirejson import dump_record

if TYPE_CHECKING:
    from gradwatch.server.reader import Reader


def export_lines(reader: Reader, run_id: str, rank: int = 0) -> Iterator[str] | None:
    """The stream of one rank as step-log lines (header first, then in seq order), or
    ``None`` if there is no such run."""
    rid = reader.rid(run_id)
    if rid is None:
        return None

    def gen() -> Iterator[str]:
        c = reader.database.open_reader()
        try:
            c.execute("BEGIN")
            opts = dict(c.execute("SELECT sid, opt FROM series WHERE rid=? AND rank=?",
                                  (rid, rank)).fetchall())
            notes, tags = c.execute("SELECT notes, tags FROM runs WHERE rid=?",
                                    (rid,)).fetchone()
            # Stored as received (version 1 forms); written again at today's version,
            # which the header then says, like every step line.
            records = ((seq, dump_record(_noted(parse_record(body, 1), notes, tags)))
                       for seq, body in c.execute(
                           "SELECT seq, body FROM records WHERE rid=? AND rank=? ORDER BY seq",
                           (rid, rank)))
            scalars = ((seq, _scalars_line(seq, *rest)) for seq, *rest in c.execute(
                "SELECT seq, t, step, opt, vals FROM scalars WHERE rid=? AND rank=? "
                "ORDER BY seq", (rid, rank)))
            marks = ",".join("?" * len(opts))
            # (no series: no statement, as `IN ()` is SQLite's alone)
            steps = ((t[0], _step_line(opts[t[-1]], t[:-1])) for t in (c.execute(
                RECORD_SELECT.replace("p.fresh ", "p.fresh, s.sid ", 1)
                + f"WHERE s.sid IN ({marks}) ORDER BY s.seq", tuple(opts)) if opts else ()))
            for _, line in heapq.merge(records, scalars, steps, key=lambda x: x[0]):
                yield line + "\n"
        finally:
            c.close()
    return gen()


def export_csv(reader: Reader, run_id: str) -> Iterator[str] | None:
    """Every step row of a run as CSV lines, or ``None`` if there is no such run."""
    rid = reader.rid(run_id)
    if rid is None:
        return None

    def gen() -> Iterator[str]:
        # The csv module quotes what needs it: an optimizer named `G "main", v2` stays
        # one cell.
        buf = io.StringIO()
        out = csv.writer(buf, lineterminator="\n")
        out.writerow(Row._fields)
        c = reader.database.open_reader()
        try:
            cur = c.execute(STEP_SELECT + "WHERE e.rid=? ORDER BY e.rank, e.opt, s.step",
                            (rid,))
            while rows := cur.fetchmany(1000):
                out.writerows(_csv_cells(to_row(t)) for t in rows)
                yield buf.getvalue()
                buf.seek(0)
                buf.truncate()
        finally:
            c.close()
        if buf.tell():  # the header of a run without steps
            yield buf.getvalue()
    return gen()


def _csv_cells(r: Row) -> list[object]:
    """A step row as CSV cells: resets as ``how:n;how:n``, learning rates as ``a;b``, an
    unsampled norm empty, text made safe for spreadsheets (:func:`spreadsheet_text`)."""
    cells: list[object] = ["" if x is None else x for x in r]
    cells[_RESETS] = ";".join(f"{h}:{n}" for h, n in r.resets)
    cells[_LR] = "" if r.lr is None else ";".join(map(repr, r.lr))
    return [spreadsheet_text(c) if isinstance(c, str) else c for c in cells]


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
"""What makes a spreadsheet read a cell as a formula (OWASP's CSV injection list)."""


def spreadsheet_text(text: str) -> str:
    """A CSV text cell that a spreadsheet shows as text: one starting with ``=``, ``+``,
    ``-``, ``@``, a tab or a carriage return gets a leading ``'`` (an optimizer named
    ``=HYPERLINK(...)`` stays a name, not a link); a number stays a number."""
    if not text.startswith(FORMULA_START):
        return text
    try:
        float(text)
        return text  # "-0.5": a number, read as one
    except ValueError:
        return "'" + text


_RESETS, _LR = Row._fields.index("resets"), Row._fields.index("lr")


def _step_line(opt: str, t: tuple[Any, ...]) -> str:
    """A step record's line at today's version, rebuilt from its columns and validated (an
    export's header says today's version, where a left-out field can mean "implied")."""
    return dump_record(Step.model_validate(step_record(opt, t)))


def _noted(record: Any, notes: str, tags: str) -> Any:
    """A header record with the run's notes and tags (JSON list) as they are now; any other
    record as it is."""
    if isinstance(record, Header):
        record.notes, record.tags = notes, json.loads(tags)
    return record


def _scalars_line(seq: int, t: float, step: int, opt: str | None, vals: str) -> str:
    return dump_record(Scalars(seq=seq, t=t, step=step, opt=opt, values=json.loads(vals)))
