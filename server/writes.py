"""How one validated batch lands in the database, inside the writer's transaction.

Runs on the storage writer thread only. Each record goes to ``records`` once by (run,
rank, seq); only records new to the database update the columns, counters, chunk
summaries and the run's :class:`~gradwatch.verdict.Verdict`, so a resend changes nothing.
Per-parameter norms stay in the step records (read back for the few steps a heatmap
shows).
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from gradwatch.frames import OptimizerView
from gradwatch.server.batch import Batch, Entry, IngestResult
from gradwatch.server.rows import Row
from gradwatch.server.runstate import RunState
from gradwatch.server.steptable import step_values
from gradwatch.wire import End, Header, OptimizerInfo, Scalars, Stats

_INSERT_RECORD = "INSERT OR IGNORE INTO records(rid, rank, seq, kind, body) VALUES(?,?,?,?,?)"
_INSERT_STEP = ("INSERT OR REPLACE INTO steps(rid, rank, opt, step, seq, t, norm, fresh_norm, "
                "drift, nan, stale, leaked, late, discarded, skipped, resets, loss, lr) "
                "VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)")


def write_batch(conn: sqlite3.Connection, st: RunState, batch: Batch,
                res: IngestResult) -> None:
    """Store the records of ``batch`` new to the database; fill ``res`` with the changes."""
    rid, rank = st.rid, batch.rank
    max_seq = st.max_seq.get(rank, -1)
    new: list[Entry] = []
    fresh_rows = []
    for e in batch.entries:
        row = (rid, rank, e.seq, e.kind, e.body)
        if e.seq > max_seq:  # above the highest stored seq: new for sure
            fresh_rows.append(row)
            new.append(e)
        elif conn.execute(_INSERT_RECORD, row).rowcount == 1:  # a gap being filled
            new.append(e)
    conn.executemany(_INSERT_RECORD, fresh_rows)
    if not new:
        return
    step_rows: list[tuple[Any, ...]] = []
    touched: dict[str, list[Row]] = {}
    changed = False
    for e in new:
        if e.row is not None:
            step_rows.append(step_values(rid, e.seq, e.row))
            res.rows.append(e.row)
            touched.setdefault(e.row.opt, []).append(e.row)
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
                st.optimizers.append(r.opt)
            res.optimizers.append(OptimizerView(rank=rank, opt=r.opt, cls=r.cls,
                                                params=r.params, shapes=r.shapes,
                                                groups=r.groups, label=r.label))
        elif isinstance(r, Scalars):
            res.scalars.extend((rank, r.opt, r.step, k, v) for k, v in r.values.items())
        elif isinstance(r, (Stats, End)):
            st.dropped[rank] = max(st.dropped.get(rank, 0), r.dropped)
            if isinstance(r, End):
                st.ended[rank] = r.status
        for f in st.verdict.feed(r, rank):
            changed = True
            key = (f.rank, f.optimizer, f.kind)
            st.finding_keys.add(key)
            conn.execute("INSERT OR REPLACE INTO findings VALUES(?,?,?,?,?,?)",
                         (rid, *key, f.first_step, f.model_dump_json()))
    conn.executemany(_INSERT_STEP, step_rows)
    for opt, opt_rows in touched.items():
        st.chunks.add(conn, rank, opt, opt_rows)
    if changed:
        res.findings = st.verdict.findings()
    res.stored = len(new)
    st.steps += len(step_rows)
    st.max_seq[rank] = max(max_seq, max(e.seq for e in new))
    st.updated = max(st.updated, max(e.t for e in new))
    st.status = st.final_status() or "live"
    conn.execute(
        "UPDATE runs SET status=?, updated=?, steps=?, findings=?, ranks=?, optimizers=?, "
        "dropped=? WHERE rid=?",
        (st.status, st.updated, st.steps, len(st.finding_keys), json.dumps(sorted(st.ranks)),
         json.dumps(st.optimizers), sum(st.dropped.values()), rid))
    conn.execute("INSERT OR REPLACE INTO streams VALUES(?,?,?,?,?)",
                 (rid, rank, st.max_seq[rank], st.ended.get(rank), st.dropped.get(rank, 0)))
