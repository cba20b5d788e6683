"""Read side of storage: run summaries, downsampled step series, per-parameter norms.

Reads use their own connections (WAL lets them run beside the writer) and are called
from worker threads. Long ranges downsample from the ``step_agg`` chunk summaries, so a
million-step series costs ~16k small rows plus the few thousand rows it returns.
"""

from __future__ import annotations

import json
import math
import queue
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gradwatch.server import db
from gradwatch.server.series import (
    ROWS_PER_BUCKET,
    Row,
    bucket_size,
    is_flagged,
    reset_sig,
    to_series,
)
from gradwatch.server.writes import STEP_SELECT, read_rows, to_row

from gradwatch.frames import OptimizerView, ParamSeries, RunSummary, StepSeries
from gradwatch.wire import Finding

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
                                     groups=d.get("groups", [])))
        return out

    def findings(self, run_id: str) -> list[Finding] | None:
        """The run's findings (as the Judge last computed them), or ``None``."""
        with self.conn() as c:
            rid = self._rid(c, run_id)
            if rid is None:
                return None
            return [Finding.model_validate_json(b) for (b,) in c.execute(
                "SELECT body FROM findings WHERE rid=? ORDER BY first_step, rank, opt, kind",
                (rid,))]

    def steps(self, run_id: str, start: int | None = None, end: int | None = None,
              max_points: int = 4000, opt: str | None = None,
              rank: int | None = None) -> StepSeries | None:
        """Step rows in [start, end], ≤ ``max_points`` per (rank, opt); ``None``: no run."""
        lo, hi = (-1 if start is None else start), (INF if end is None else end)
        with self.conn() as c:
            rid = self._rid(c, run_id)
            if rid is None:
                return None
            c.execute("BEGIN")  # one consistent snapshot across the queries below
            rows: list[Row] = []
            bucket, total = 1, 0
            for r, o, nxt in c.execute(
                    "SELECT rank, opt, next_chunk FROM series WHERE rid=? ORDER BY rank, opt",
                    (rid,)).fetchall():
                if (rank is not None and r != rank) or (opt is not None and o != opt):
                    continue
                got, b, n = _series_rows(c, rid, r, o, lo, hi, max_points, nxt)
                rows += got
                bucket, total = max(bucket, b), total + n
            c.execute("COMMIT")
        return to_series(rows, bucket, bucket > 1, total)

    def last_steps(self, run_id: str) -> dict[tuple[int, str], int]:
        """Highest stored step of each (rank, opt) of a run."""
        with self.conn() as c:
            return {(r, o): s for r, o, s in c.execute(
                "SELECT s.rank, s.opt, (SELECT max(step) FROM steps t WHERE t.rid=s.rid "
                "AND t.rank=s.rank AND t.opt=s.opt) FROM series s JOIN runs u ON "
                "u.rid=s.rid WHERE u.id=?", (run_id,)) if s is not None}

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
            where = "WHERE rid=? AND rank=? AND opt=? AND step BETWEEN ? AND ?"
            args = (rid, rank, opt, lo, hi)
            n, smin, smax = c.execute(f"SELECT count(*), min(step), max(step) FROM "
                                      f"param_norms {where}", args).fetchone()
            b = 1 if n <= max_points else math.ceil((smax - smin + 1) / max_points)
            if b == 1:
                cur = c.execute(f"SELECT step, norms, fresh FROM param_norms {where} "
                                f"ORDER BY step", args)
            else:  # SQLite fills bare columns from the row holding the max()
                cur = c.execute(f"SELECT step, norms, fresh, max(coalesce(total, -1)) FROM "
                                f"param_norms {where} GROUP BY step / ? ORDER BY step",
                                (*args, b))
            steps, norms, fresh = [], [], []
            for t in cur:
                steps.append(t[0])
                norms.append(_unpack(t[1]))
                fresh.append(_unpack(t[2]))
        return ParamSeries(opt=opt, rank=rank, params=names, step=steps, norm=norms,
                           fresh_norm=fresh, bucket=b)

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
            yield ",".join(Row._fields) + "\n"
            c = db.connect(self.data_dir, readonly=True)
            try:
                for t in c.execute(STEP_SELECT + "WHERE rid=? ORDER BY rank, opt, step",
                                   (rid,)):
                    r = to_row(t)
                    cells = [json.dumps(x) if isinstance(x, str) else
                             ";".join(f"{h}:{n}" for h, n in x) if isinstance(x, tuple)
                             else "" if x is None else str(x) for x in r]
                    yield ",".join(cells) + "\n"
            finally:
                c.close()
        return gen()


def _unpack(blob: bytes | None) -> list[float | None]:
    from array import array
    a = array("d")
    if blob:
        a.frombytes(blob)
    return list(a)


def _series_rows(c: sqlite3.Connection, rid: int, rank: int, opt: str, lo: int, hi: int,
                 max_points: int, next_chunk: int) -> tuple[list[Row], int, int]:
    """Rows of one (rank, opt) in [lo, hi], downsampled; with bucket size and total."""
    n, smin, smax = c.execute(
        "SELECT count(*), min(step), max(step) FROM steps WHERE rid=? AND rank=? AND opt=? "
        "AND step BETWEEN ? AND ?", (rid, rank, opt, lo, hi)).fetchone()
    if n <= max_points:
        return read_rows(c, rid, rank, opt, lo, hi), 1, n
    b = bucket_size(smin, smax, max_points)
    cands: dict[int, dict[str, tuple[float, int]]] = {}
    raw: dict[int, Row] = {}
    ranges = [(smin, smax)]
    if b >= db.CHUNK:
        b = math.ceil(b / db.CHUNK) * db.CHUNK
        c_lo = -(-smin // db.CHUNK)
        c_hi = min(next_chunk - 1, (smax + 1) // db.CHUNK - 1)
        if c_hi >= c_lo:
            ranges = [(smin, c_lo * db.CHUNK - 1), ((c_hi + 1) * db.CHUNK, smax)]
            for a in c.execute(
                    "SELECT chunk, mn_norm, mn_norm_step, mx_norm, mx_norm_step, mn_drift, "
                    "mn_drift_step, mx_drift, mx_drift_step, flag_step, odd_step FROM "
                    "step_agg WHERE rid=? AND rank=? AND opt=? AND chunk BETWEEN ? AND ?",
                    (rid, rank, opt, c_lo, c_hi)):
                d = cands.setdefault(a[0] * db.CHUNK // b, {})
                for name, i, sign in (("mn_norm", 1, 1), ("mx_norm", 3, -1),
                                      ("mn_drift", 5, 1), ("mx_drift", 7, -1)):
                    if a[i] is not None:
                        _better(d, name, sign * a[i], a[i + 1])
                for name, i in (("flag", 9), ("odd", 10)):
                    if a[i] is not None:
                        _better(d, name, a[i], a[i])
    for r0, r1 in ranges:
        for r in (read_rows(c, rid, rank, opt, r0, r1) if r1 >= r0 else ()):
            raw[r.step] = r
            d = cands.setdefault(r.step // b, {})
            for name, i, sign in (("mn_norm", 4, 1), ("mx_norm", 4, -1),
                                  ("mn_drift", 6, 1), ("mx_drift", 6, -1)):
                v = r[i]
                if v is not None and math.isfinite(v):
                    _better(d, name, sign * v, r.step)
            if is_flagged(r):
                _better(d, "flag", r.step, r.step)
            if r.resets and reset_sig(r) != ("optimizer_zero_grad",):
                _better(d, "odd", r.step, r.step)
    keep = sorted({s for d in cands.values() for _, s in d.values()})
    missing = [s for s in keep if s not in raw]
    for i in range(0, len(missing), 900):
        part = missing[i:i + 900]
        for t in c.execute(STEP_SELECT + f"WHERE rid=? AND rank=? AND opt=? AND step IN "
                           f"({','.join('?' * len(part))})", (rid, rank, opt, *part)):
            raw[t[2]] = to_row(t)
    assert len(cands) * ROWS_PER_BUCKET >= len(keep)
    return [raw[s] for s in keep if s in raw], b, n


def _better(d: dict[str, tuple[float, int]], name: str, key: float, step: int) -> None:
    cur = d.get(name)
    if cur is None or key < cur[0]:
        d[name] = (key, step)
