"""How one validated batch lands in the database, inside the writer's transaction.

Runs on the storage writer thread only. A step is stored once per (series, step): one
resent, under its old seq or new ones, changes nothing (counters, rows and earlier data
stand). Other records are stored once by (run, rank, seq). Only what is new to the
database updates the columns, counters, chunk summaries and the run's
:class:`~gradwatch.verdict.Verdict`.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from gradwatch.frames import OptimizerView
from gradwatch.server import prefix
from gradwatch.server.batch import Batch, Entry, IngestResult
from gradwatch.server.errors import InvalidStream
from gradwatch.server.rows import Row, StepCols, must_keep
from gradwatch.server.runstate import RunState
from gradwatch.server.steptable import PARAMS_INSERT, STEPS_INSERT
from gradwatch.wire import End, Header, OptimizerInfo, Scalars, Stats

if TYPE_CHECKING:
    from gradwatch.server.backend import Conn

MAX_OPTIMIZERS = 256
"""Optimizers one run may hold: the dashboard draws a panel and a legend entry per
optimizer, and thousands would keep a tab busy for seconds."""

_INSERT_RECORD = "INSERT OR IGNORE INTO records(rid, rank, seq, kind, body) VALUES(?,?,?,?,?)"
_INSERT_SCALARS = "INSERT OR IGNORE INTO scalars VALUES(?,?,?,?,?,?,?)"


class ResetSets:
    """``reset_sets`` ids by body, cached on the writer thread (cleared on a rollback)."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}

    def id_of(self, conn: Conn, body: str, summary: str | None) -> int:
        """The id of a resets body, adding the row the first time."""
        i = self._ids.get(body)
        if i is None:
            row = conn.execute("SELECT id FROM reset_sets WHERE body=?", (body,)).fetchone()
            if row is None:
                # Another server sharing the database may add the same body meanwhile: it
                # is kept once, and this server reads back that row.
                cur = conn.execute("INSERT OR IGNORE INTO reset_sets(body, summary) "
                                   "VALUES(?,?)", (body, summary))
                if cur.rowcount == 1 and cur.lastrowid is not None:
                    i = cur.lastrowid
                else:
                    row = conn.execute("SELECT id FROM reset_sets WHERE body=?",
                                       (body,)).fetchone()
                    i = int(row[0])
            else:
                i = int(row[0])
            if len(self._ids) > 100_000:
                self._ids.clear()
            self._ids[body] = i
        return i

    def clear(self) -> None:
        """Forget every id (a rolled-back transaction may have added some)."""
        self._ids.clear()


def step_row(conn: Conn, sid: int, c: StepCols, resets: ResetSets
             ) -> tuple[Any, ...]:
    """The ``steps`` values of one step's columns in series ``sid``."""
    if c.resets is not None:
        c = c._replace(rset=resets.id_of(conn, c.resets, c.summary))
    return c.steps_values(sid)


def _new_steps(conn: Conn, st: RunState, rank: int,
               steps: list[Entry]) -> list[tuple[int, Entry]]:
    """The steps of a batch not stored yet, with their series ids."""
    out: list[tuple[int, Entry]] = []
    seen: set[tuple[int, int]] = set()
    for e in steps:
        assert e.where is not None and e.cols is not None
        sid = st.series(conn, rank, e.where[1])
        step = e.cols.step
        if step > st.last_step.get(sid, -1):  # above every stored step: new for sure
            st.last_step[sid] = step
        elif (sid, step) in seen or conn.execute(
                "SELECT 1 FROM steps WHERE sid=? AND step=?", (sid, step)).fetchone():
            continue  # already stored: a resend, maybe under new seq numbers
        seen.add((sid, step))
        out.append((sid, e))
    return out


def write_batch(conn: Conn, st: RunState, batch: Batch, res: IngestResult,
                resets: ResetSets) -> bool:
    """Store what of ``batch`` is new to the database; fill ``res`` with the changes.
    Returns whether anything was written (False: a resend of what is stored)."""
    rid, rank = st.rid, batch.rank
    max_seq = st.max_seq.get(rank, -1)
    new: list[Entry] = []
    steps: list[Entry] = []
    for e in batch.entries:
        if e.kind == "step":
            steps.append(e)
        elif e.kind == "scalars":
            r = e.record
            assert isinstance(r, Scalars)
            if conn.execute(_INSERT_SCALARS, (rid, rank, e.seq, r.step, r.opt,
                                              json.dumps(r.values), e.t)).rowcount == 1:
                new.append(e)
        elif conn.execute(_INSERT_RECORD, (rid, rank, e.seq, e.kind, e.body)).rowcount == 1:
            new.append(e)
    fresh = _new_steps(conn, st, rank, steps)
    top = max([max_seq] + [e.seq for e in batch.entries])
    if not new and not fresh and top == max_seq:
        return False
    step_rows: list[tuple[Any, ...]] = []
    param_rows: list[tuple[Any, ...]] = []
    touched: dict[int, list[Row]] = {}
    for sid, e in fresh:
        c, row = e.cols, e.row
        assert c is not None and row is not None
        step_rows.append(step_row(conn, sid, c, resets))
        if c.has_params():
            keep = st.keep_every.get(sid, 1)
            if keep <= 1 or c.step % keep == 0 or must_keep(row):
                param_rows.append((sid, c.step, c.params, c.pfresh))
        res.rows.append(row)
        touched.setdefault(sid, []).append(row)
        new.append(e)
    new.sort(key=lambda e: e.seq)  # the verdict reads a stream in its order
    changed = False
    for e in new:
        r = e.record
        if r is None:
            continue  # a step without finding facts changes no finding
        if isinstance(r, Header):
            if rank not in st.ranks:
                st.ranks.append(rank)
        elif isinstance(r, OptimizerInfo):
            conn.execute("INSERT OR REPLACE INTO optimizers VALUES(?,?,?,?)",
                         (rid, rank, r.opt, e.body))
            if r.opt not in st.optimizers:
                if len(st.optimizers) >= MAX_OPTIMIZERS:
                    raise InvalidStream(
                        f"a run holds at most {MAX_OPTIMIZERS} optimizers ({r.opt!r} would "
                        f"be one more); watch fewer, or give parameter groups to one")
                st.optimizers.append(r.opt)
            res.optimizers.append(OptimizerView(rank=rank, opt=r.opt, cls=r.cls,
                                                params=r.params, shapes=r.shapes,
                                                groups=r.groups, label=r.label,
                                                hparams=r.hparams,
                                                placements=r.placements))
        elif isinstance(r, (Stats, End)):
            st.dropped[rank] = max(st.dropped.get(rank, 0), r.dropped)
            if isinstance(r, End):
                st.ended[rank] = r.status
        elif isinstance(r, Scalars):  # the verdict has no use for them
            res.scalars.extend((rank, r.opt, r.step, k, v) for k, v in r.values.items())
            continue
        for f in st.verdict.feed(r, rank):
            changed = True
            key = (f.rank, f.optimizer, f.kind)
            st.finding_keys.add(key)
            conn.execute("INSERT OR REPLACE INTO findings VALUES(?,?,?,?,?,?)",
                         (rid, *key, f.first_step, f.model_dump_json()))
    conn.executemany(STEPS_INSERT, step_rows)
    conn.executemany(PARAMS_INSERT, param_rows)
    for sid, rows in touched.items():
        st.chunks.add(conn, sid, rows)
    if changed:
        res.findings = st.verdict.findings()
    res.stored = len(new)
    st.steps += len(step_rows)
    st.max_seq[rank] = top
    st.acked[rank] = prefix.advance(conn, rid, rank, st.acked.get(rank, -1),
                                    (e.seq for e in batch.entries), top)
    if new:
        st.updated = max(st.updated, max(e.t for e in new))
    st.status = st.final_status() or "live"
    conn.execute(
        "UPDATE runs SET status=?, updated=?, steps=?, findings=?, ranks=?, optimizers=?, "
        "dropped=? WHERE rid=?",
        (st.status, st.updated, st.steps, len(st.finding_keys), json.dumps(sorted(st.ranks)),
         json.dumps(st.optimizers), sum(st.dropped.values()), rid))
    conn.execute("INSERT INTO streams(rid, rank, max_seq, ended, dropped, acked, key_hash) "
                 "VALUES(?,?,?,?,?,?,?) ON CONFLICT(rid, rank) DO UPDATE SET "
                 "max_seq=excluded.max_seq, ended=excluded.ended, dropped=excluded.dropped, "
                 "acked=excluded.acked, key_hash=excluded.key_hash",
                 (rid, rank, top, st.ended.get(rank), st.dropped.get(rank, 0), st.acked[rank],
                  st.keys.get(rank)))
    return True
