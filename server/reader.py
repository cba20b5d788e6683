"""Read side of storage: run summaries, downsampled step series, per-parameter norms.

Reads use their own read-only connections (SQLite's WAL, PostgreSQL's MVCC let them run
beside the writer) and are called from worker threads; a long series downsamples from its
chunk summaries (:mod:`server.series_read`). Plain module: no FastAPI.
"""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gradwatch.frames import OptimizerView, ParamSeries, RunSummary, ScalarSeries
from gradwatch.server import exports
from gradwatch.server.backend import Conn, Database, open_database
from gradwatch.server.rows import Row, SeriesRows
from gradwatch.server.series_read import param_steps, series_rows
from gradwatch.server.steptable import (
    FLAG_PFRESH_IS_PNORM,
    unpack_norms,
)
from gradwatch.verdict import Verdict
from gradwatch.wire import Finding, parse_record

_SUMMARY = ("SELECT id, name, status, started, updated, steps, findings, ranks, optimizers, "
            "dropped, torch_version, notes, tags FROM runs ")
INF = 1 << 62


def _summary(c: Conn, t: tuple[Any, ...]) -> RunSummary:
    return RunSummary(id=t[0], name=t[1], status=t[2], started=t[3], updated=t[4],
                      steps=t[5], findings=t[6], ranks=json.loads(t[7]),
                      optimizers=json.loads(t[8]), dropped=t[9], torch_version=t[10],
                      notes=t[11], tags=json.loads(t[12]), stopped=_stopped(c, t[0]))


def _stopped(c: Conn, run_id: str) -> str | None:
    """Where judging stopped in the run (its ranks' ``Stats`` records, by the verdict's
    rule), or None."""
    v = Verdict()
    for rank, body in c.execute(
            "SELECT r.rank, r.body FROM records r JOIN runs u ON r.rid = u.rid "
            "WHERE u.id=? AND r.kind='stats' ORDER BY r.rank, r.seq", (run_id,)):
        v.feed(parse_record(body, 1), rank)
    return v.stopped_text()


class Reader:
    """Read-only queries over a database (thread-safe).

    Args:
        where: a data directory, a ``postgresql://`` URL or a
            :class:`~server.backend.Database` (:func:`server.backend.open_database`).
    """

    def __init__(self, where: Path | str | Database):
        self.database = open_database(where)
        self._pool: queue.LifoQueue[Conn] = queue.LifoQueue()

    @contextmanager
    def conn(self) -> Iterator[Conn]:
        """A pooled connection for the duration of a ``with`` block."""
        try:
            c = self._pool.get_nowait()
        except queue.Empty:
            c = self.database.open_reader()
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

    def _rid(self, c: Conn, run_id: str) -> int | None:
        row = c.execute("SELECT rid FROM runs WHERE id=?", (run_id,)).fetchone()
        return None if row is None else int(row[0])

    def rid(self, run_id: str) -> int | None:
        """The run's row id in the database, or None if there is no such run."""
        with self.conn() as c:
            return self._rid(c, run_id)

    def runs(self) -> list[RunSummary]:
        """Every run, newest first."""
        with self.conn() as c:
            rows = c.execute(_SUMMARY + "ORDER BY started DESC").fetchall()
            return [_summary(c, t) for t in rows]

    def summary(self, run_id: str) -> RunSummary | None:
        """A run's summary, or ``None``."""
        with self.conn() as c:
            t = c.execute(_SUMMARY + "WHERE id=?", (run_id,)).fetchone()
            return None if t is None else _summary(c, t)

    def run(self, run_id: str) -> dict[str, Any] | None:
        """Summary plus ``optimizers`` and ``header`` of a run, or ``None``."""
        with self.conn() as c:
            t = c.execute(_SUMMARY + "WHERE id=?", (run_id,)).fetchone()
            if t is None:
                return None
            out = _summary(c, t).model_dump(mode="json")
            out["optimizers"] = [v.model_dump(mode="json") for v in self._optimizers(c, t[0])]
            out["header"] = json.loads(c.execute("SELECT header FROM runs WHERE id=?",
                                                 (run_id,)).fetchone()[0])
            return out

    def optimizers(self, run_id: str) -> list[OptimizerView]:
        """A run's optimizers (every rank)."""
        with self.conn() as c:
            return self._optimizers(c, run_id)

    def _optimizers(self, c: Conn, run_id: str) -> list[OptimizerView]:
        out = []
        for rank, body in c.execute(
                "SELECT o.rank, o.body FROM optimizers o JOIN runs r ON r.rid=o.rid "
                "WHERE r.id=? ORDER BY o.rank, o.opt", (run_id,)):
            d = json.loads(body)
            out.append(OptimizerView(rank=rank, opt=d["opt"], cls=d.get("cls", ""),
                                     params=d.get("params", []), shapes=d.get("shapes", []),
                                     groups=d.get("groups", []), label=d.get("label"),
                                     hparams=d.get("hparams", []),
                                     placements=d.get("placements")))
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
            for sid, r, o, nxt in c.execute(
                    "SELECT sid, rank, opt, next_chunk FROM series WHERE rid=? ORDER BY rank, "
                    "opt", (rid,)).fetchall():
                if (rank is not None and r != rank) or (opt is not None and o != opt):
                    continue
                got, b, n = series_rows(c, sid, lo, hi, max_points, nxt)
                rows += got
                bucket, total = max(bucket, b), total + n
            if last is not None:
                last.update({(r, o): s for r, o, s in c.execute(
                    "SELECT e.rank, e.opt, (SELECT max(step) FROM steps t WHERE t.sid=e.sid) "
                    "FROM series e WHERE e.rid=?", (rid,))
                    if s is not None})
            c.execute("COMMIT")
        return SeriesRows(rows, bucket, bucket > 1, total)

    def params(self, run_id: str, opt: str, rank: int = 0, start: int | None = None,
               end: int | None = None, max_points: int = 500) -> ParamSeries | None:
        """Per-parameter norms of one optimizer; per bucket the step of largest norm (or
        the nearest step whose per-parameter norms are kept)."""
        lo, hi = (-1 if start is None else start), (INF if end is None else end)
        with self.conn() as c:
            row = c.execute("SELECT o.rid, o.body FROM optimizers o JOIN runs r ON "
                            "r.rid=o.rid WHERE r.id=? AND o.rank=? AND o.opt=?",
                            (run_id, rank, opt)).fetchone()
            if row is None:
                return None
            rid, names = row[0], json.loads(row[1]).get("params", [])
            ser = c.execute("SELECT sid, next_chunk, keep_every FROM series WHERE rid=? AND "
                            "rank=? AND opt=?", (rid, rank, opt)).fetchone()
            if ser is None:
                return ParamSeries(opt=opt, rank=rank, params=names, step=[], norm=[],
                                   fresh_norm=[])
            sid = ser[0]
            picked, b = param_steps(c, sid, lo, hi, max_points, ser[1])
            reads: list[tuple[str, tuple[int, ...]]] = [("BETWEEN ? AND ?", (lo, hi))]
            if picked is not None:
                near = {_kept_near(c, sid, x, b, lo, hi) for x in picked}
                kept = sorted(x for x in near if x is not None)
                reads = [(f"IN ({','.join('?' * len(kept[i:i + 900]))})", tuple(kept[i:i + 900]))
                         for i in range(0, len(kept), 900)]
            got: list[tuple[int, Any, Any, int]] = []
            for cond, args in reads:
                # Two range reads, not a join: PostgreSQL's packed steps are read by range
                # (server.pgpack), where a join would unpack a chunk for every row.
                flags = dict(c.execute(f"SELECT step, flags FROM steps WHERE sid=? AND step "
                                       f"{cond}", (sid, *args)).fetchall())
                got += [(step, pn, pf, flags[step]) for step, pn, pf in c.execute(
                    f"SELECT step, norms, fresh FROM param_norms WHERE sid=? AND step {cond} "
                    "ORDER BY step", (sid, *args)) if step in flags]
            steps, norms, fresh = [], [], []
            for step, pn, pf, flags_of in got:
                n = unpack_norms(pn)
                steps.append(step)
                norms.append(n or [])
                fresh.append((n if flags_of & FLAG_PFRESH_IS_PNORM else unpack_norms(pf)) or [])
        return ParamSeries(opt=opt, rank=rank, params=names, step=steps, norm=norms,
                           fresh_norm=fresh, bucket=b)

    def export_lines(self, run_id: str, rank: int = 0) -> Iterator[str] | None:
        """One rank's stream as step-log lines (:func:`server.exports.export_lines`)."""
        return exports.export_lines(self, run_id, rank)

    def export_csv(self, run_id: str) -> Iterator[str] | None:
        """The run's step rows as CSV lines (:func:`server.exports.export_csv`)."""
        return exports.export_csv(self, run_id)

    def scalars(self, run_id: str, limit: int = 200_000) -> ScalarSeries | None:
        """The values the user logged (``Scalars`` records), the first ``limit`` of them,
        or ``None`` when there is no such run."""
        with self.conn() as c:
            rid = self._rid(c, run_id)
            if rid is None:
                return None
            out = ScalarSeries()
            for rank, opt, step, vals in c.execute(
                    "SELECT rank, opt, step, vals FROM scalars WHERE rid=? ORDER BY rank, seq",
                    (rid,)):
                for name, value in json.loads(vals).items():
                    out.total += 1
                    if out.total > limit:
                        continue
                    out.rank.append(rank)
                    out.opt.append(opt)
                    out.step.append(step)
                    out.name.append(name)
                    out.value.append(value)  # json.dumps wrote NaN as NaN: a float
            return out


def _kept_near(c: Conn, sid: int, step: int, b: int, lo: int, hi: int
               ) -> int | None:
    """``step`` if its per-parameter norms are kept, else the nearest kept step of its
    bucket (retention or ``norms_every`` leaves some steps without them)."""
    if c.execute("SELECT 1 FROM param_norms WHERE sid=? AND step=?", (sid, step)).fetchone():
        return step
    b0, b1 = max(lo, step - step % b), min(hi, step - step % b + b - 1)
    before = c.execute("SELECT max(step) FROM param_norms WHERE sid=? AND step BETWEEN ? "
                       "AND ?", (sid, b0, step)).fetchone()[0]
    after = c.execute("SELECT min(step) FROM param_norms WHERE sid=? AND step BETWEEN ? "
                      "AND ?", (sid, step, b1)).fetchone()[0]
    if before is None or (after is not None and after - step < step - before):
        return after
    return before
