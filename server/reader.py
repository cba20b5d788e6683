"""Read side of storage: run summaries, downsampled step series, per-parameter norms.

Reads use their own read-only connections (WAL lets them run beside the writer) and are
called from worker threads; a long series downsamples from its chunk summaries
(:mod:`server.series_read`). Plain module: no FastAPI.
"""

from __future__ import annotations

import csv
import io
import json
import queue
import sqlite3
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gradwatch.frames import OptimizerView, ParamSeries, RunSummary, ScalarSeries
from gradwatch.server import db
from gradwatch.server.rows import Row, SeriesRows
from gradwatch.server.series_read import param_steps, series_rows
from gradwatch.server.steptable import STEP_SELECT, to_row
from gradwatch.wire import Finding, Scalars

_SUMMARY = ("SELECT id, name, status, started, updated, steps, findings, ranks, optimizers, "
            "dropped, torch_version FROM runs ")
INF = 1 << 62


def _summary(t: tuple[Any, ...]) -> RunSummary:
    return RunSummary(id=t[0], name=t[1], status=t[2], started=t[3], updated=t[4],
                      steps=t[5], findings=t[6], ranks=json.loads(t[7]),
                      optimizers=json.loads(t[8]), dropped=t[9], torch_version=t[10])


class Reader:
    """Read-only queries over the data directory's database (thread-safe)."""

    def __init__(self, data_dir: Path):
        self.data_dir = data_dir
        self._pool: queue.LifoQueue[sqlite3.Connection] = queue.LifoQueue()

    @contextmanager
    def conn(self) -> Iterator[sqlite3.Connection]:
        """A pooled connection for the duration of a ``with`` block."""
        try:
            c = self._pool.get_nowait()
        except queue.Empty:
            c = db.connect(self.data_dir, readonly=True)
        try:
            yield c
        finally:
            if c.in_transaction:
                c.execute("ROLLBACK")
            self._pool.put(c)

    def close(self) -> None:
        """Close pooled connections."""
        while not self._pool.empty():
            self._pool.get_nowait().close()

    def _rid(self, c: sqlite3.Connection, run_id: str) -> int | None:
        row = c.execute("SELECT rid FROM runs WHERE id=?", (run_id,)).fetchone()
        return None if row is None else int(row[0])

    def runs(self) -> list[RunSummary]:
        """Every run, newest first."""
        with self.conn() as c:
            return [_summary(t) for t in c.execute(_SUMMARY + "ORDER BY started DESC")]

    def summary(self, run_id: str) -> RunSummary | None:
        """A run's summary, or ``None``."""
        with self.conn() as c:
            t = c.execute(_SUMMARY + "WHERE id=?", (run_id,)).fetchone()
            return None if t is None else _summary(t)

    def run(self, run_id: str) -> dict[str, Any] | None:
        """Summary plus ``optimizers`` and ``header`` of a run, or ``None``."""
        with self.conn() as c:
            t = c.execute(_SUMMARY + "WHERE id=?", (run_id,)).fetchone()
            if t is None:
                return None
            out = _summary(t).model_dump(mode="json")
            out["optimizers"] = [v.model_dump(mode="json") for v in self._optimizers(c, t[0])]
            out["header"] = json.loads(c.execute("SELECT header FROM runs WHERE id=?",
                                                 (run_id,)).fetchone()[0])
            return out

    def optimizers(self, run_id: str) -> list[OptimizerView]:
        """A run's optimizers (every rank)."""
        with self.conn() as c:
            return self._optimizers(c, run_id)

    def _optimizers(self, c: sqlite3.Connection, run_id: str) -> list[OptimizerView]:
        out = []
        for rank, body in c.execute(
                "SELECT o.rank, o.body FROM optimizers o JOIN runs r ON r.rid=o.rid "
                "WHERE r.id=? ORDER BY o.rank, o.opt", (run_id,)):
            d = json.loads(body)
            out.append(OptimizerView(rank=rank, opt=d["opt"], cls=d.get("cls", ""),
                                     params=d.get("params", []), shapes=d.get("shapes", []),
                                     groups=d.get("groups", []), label=d.get("label")))
        return out

    def findings(self, run_id: str) -> list[Finding] | None:
        """The run's findings as its Verdict last grouped them, or ``None``: no such run."""
        with self.conn() as c:
            rid = self._rid(c, run_id)
            if rid is None:
                return None
            return [Finding.model_validate_json(b) for (b,) in c.execute(
                "SELECT body FROM findings WHERE rid=? ORDER BY first_step, rank, opt, kind",
                (rid,))]

    def steps(self, run_id: str, start: int | None = None, end: int | None = None,
              max_points: int = 4000, opt: str | None = None, rank: int | None = None,
              last: dict[tuple[int, str], int] | None = None) -> SeriesRows | None:
        """Step rows in [start, end], ≤ ``max_points`` per (rank, opt); ``None``: no run.

        Series longer than ``max_points`` are downsampled (:mod:`server.downsampling`).

        Args:
            last: if given, filled with the highest stored step of each (rank, opt), read
                in the same transaction (a live snapshot skips live rows up to these).
        """
        lo, hi = (-1 if start is None else start), (INF if end is None else end)
        with self.conn() as c:
            c.execute("BEGIN")  # one consistent snapshot across the queries below
            rid = self._rid(c, run_id)
            if rid is None:
                c.execute("COMMIT")
                return None
            rows: list[Row] = []
            bucket, total = 1, 0
            for r, o, nxt in c.execute(
                    "SELECT rank, opt, next_chunk FROM series WHERE rid=? ORDER BY rank, opt",
                    (rid,)).fetchall():
                if (rank is not None and r != rank) or (opt is not None and o != opt):
                    continue
                got, b, n = series_rows(c, rid, r, o, lo, hi, max_points, nxt)
                rows += got
                bucket, total = max(bucket, b), total + n
            if last is not None:
                last.update({(r, o): s for r, o, s in c.execute(
                    "SELECT s.rank, s.opt, (SELECT max(step) FROM steps t WHERE t.rid=s.rid "
                    "AND t.rank=s.rank AND t.opt=s.opt) FROM series s WHERE s.rid=?", (rid,))
                    if s is not None})
            c.execute("COMMIT")
        return SeriesRows(rows, bucket, bucket > 1, total)

    def params(self, run_id: str, opt: str, rank: int = 0, start: int | None = None,
               end: int | None = None, max_points: int = 500) -> ParamSeries | None:
        """Per-parameter norms of one optimizer; per bucket the step of largest norm."""
        lo, hi = (-1 if start is None else start), (INF if end is None else end)
        with self.conn() as c:
            row = c.execute("SELECT o.rid, o.body FROM optimizers o JOIN runs r ON "
                            "r.rid=o.rid WHERE r.id=? AND o.rank=? AND o.opt=?",
                            (run_id, rank, opt)).fetchone()
            if row is None:
                return None
            rid, names = row[0], json.loads(row[1]).get("params", [])
            nxt = c.execute("SELECT next_chunk FROM series WHERE rid=? AND rank=? AND opt=?",
                            (rid, rank, opt)).fetchone()
            picked, b = param_steps(c, rid, rank, opt, lo, hi, max_points,
                                    nxt[0] if nxt else 0)
            sql = ("SELECT s.step, r.body FROM steps s JOIN records r ON r.rid=s.rid AND "
                   "r.rank=s.rank AND r.seq=s.seq WHERE s.rid=? AND s.rank=? AND s.opt=? ")
            cur: Iterable[tuple[int, str]]
            if picked is None:
                cur = c.execute(sql + "AND s.step BETWEEN ? AND ? ORDER BY s.step",
                                (rid, rank, opt, lo, hi))
            else:
                got: list[tuple[int, str]] = []
                for i in range(0, len(picked), 900):
                    part = picked[i:i + 900]
                    got += c.execute(sql + f"AND s.step IN ({','.join('?' * len(part))}) "
                                           f"ORDER BY s.step", (rid, rank, opt, *part)).fetchall()
                cur = got
            steps, norms, fresh = [], [], []
            for step, body in cur:
                d = json.loads(body)
                if d.get("param_norms") is None and d.get("param_fresh_norms") is None:
                    continue  # a step the probe did not measure (norms_every > 1)
                steps.append(step)
                norms.append(_floats(d.get("param_norms")))
                fresh.append(_floats(d.get("param_fresh_norms")))
        return ParamSeries(opt=opt, rank=rank, params=names, step=steps, norm=norms,
                           fresh_norm=fresh, bucket=b)

    def scalars(self, run_id: str, limit: int = 200_000) -> ScalarSeries | None:
        """The values the user logged (``Scalars`` records), the first ``limit`` of them,
        or ``None`` when there is no such run."""
        with self.conn() as c:
            rid = self._rid(c, run_id)
            if rid is None:
                return None
            out = ScalarSeries()
            for rank, body in c.execute("SELECT rank, body FROM records WHERE rid=? AND "
                                        "kind='scalars' ORDER BY rank, seq", (rid,)):
                rec = Scalars.model_validate_json(body)
                for name, value in rec.values.items():
                    out.total += 1
                    if out.total > limit:
                        continue
                    out.rank.append(rank)
                    out.opt.append(rec.opt)
                    out.step.append(rec.step)
                    out.name.append(name)
                    out.value.append(value)
            return out

    def export_lines(self, run_id: str, rank: int = 0) -> Iterator[str] | None:
        """The stream of one rank as step-log lines (header first), or ``None``."""
        with self.conn() as c:
            rid = self._rid(c, run_id)
        if rid is None:
            return None

        def gen() -> Iterator[str]:
            c = db.connect(self.data_dir, readonly=True)
            try:
                for (body,) in c.execute("SELECT body FROM records WHERE rid=? AND rank=? "
                                         "ORDER BY seq", (rid, rank)):
                    yield body + "\n"
            finally:
                c.close()
        return gen()

    def export_csv(self, run_id: str) -> Iterator[str] | None:
        """Every step row of a run as CSV lines, or ``None``."""
        with self.conn() as c:
            rid = self._rid(c, run_id)
        if rid is None:
            return None

        def gen() -> Iterator[str]:
            # The csv module quotes what needs it: an optimizer named `G "main", v2` stays
            # one cell.
            buf = io.StringIO()
            out = csv.writer(buf, lineterminator="\n")
            out.writerow(Row._fields)
            c = db.connect(self.data_dir, readonly=True)
            try:
                cur = c.execute(STEP_SELECT + "WHERE rid=? ORDER BY rank, opt, step", (rid,))
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
    unsampled norm empty."""
    cells: list[object] = ["" if x is None else x for x in r]
    cells[_RESETS] = ";".join(f"{h}:{n}" for h, n in r.resets)
    cells[_LR] = "" if r.lr is None else ";".join(map(repr, r.lr))
    return cells


_RESETS, _LR = Row._fields.index("resets"), Row._fields.index("lr")


def _floats(xs: list[Any] | None) -> list[float | None]:
    """A JSON list of norms, with "NaN"/"Infinity" strings as floats."""
    return [float(x) if isinstance(x, str) else x for x in xs or []]
