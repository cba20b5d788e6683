"""How the records of one batch land in the database (inside the writer's transaction).

Each record goes to ``records`` once by (run, rank, seq); only records new to the database
update the columns, counters and the run's :class:`~gradwatch.verdict.Verdict`, so a resend
changes nothing. Per-parameter norms stay in the step records (read back for the few steps
a heatmap shows). Closed chunks of :data:`server.db.CHUNK` steps get their ``step_agg`` row.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections import Counter
from typing import TYPE_CHECKING, Any

from gradwatch.frames import OptimizerView
from gradwatch.server import db
from gradwatch.server.digest import Item
from gradwatch.server.runstate import RunState
from gradwatch.server.series import Row, is_flagged, reset_sig
from gradwatch.wire import End, Header, OptimizerInfo, Stats, parse_record

if TYPE_CHECKING:
    from gradwatch.server.storage import IngestResult

_NAN = float("nan")


def write_records(conn: sqlite3.Connection, st: RunState, rank: int, items: list[Item],
                  res: IngestResult) -> None:
    """Store the new records of one (run, rank) batch and fill ``res`` with the changes."""
    rid = st.rid
    max_seq = st.max_seq.get(rank, -1)
    new: list[Item] = []
    ins = "INSERT OR IGNORE INTO records(rid, rank, seq, kind, body) VALUES(?,?,?,?,?)"
    fresh_rows = []
    for it in items:
        row = (rid, rank, it.seq, it.kind, it.body)
        if it.seq > max_seq:  # above the highest stored seq: new for sure
            fresh_rows.append(row)
            new.append(it)
        elif conn.execute(ins, row).rowcount == 1:  # a gap being filled
            new.append(it)
    conn.executemany(ins, fresh_rows)
    if not new:
        return
    step_rows: list[tuple[Any, ...]] = []
    touched: dict[str, list[Row]] = {}
    changed = False
    for it in new:
        srow = it.row
        if srow is not None:
            step_rows.append(_step_columns(rid, it.seq, srow))
            res.rows.append(srow)
            touched.setdefault(srow.opt, []).append(srow)
            if not it.flagged:
                continue  # a step without finding facts changes no finding
        r = parse_record(it.body)
        if isinstance(r, Header):
            if rank not in st.ranks:
                st.ranks.append(rank)
        elif isinstance(r, OptimizerInfo):
            conn.execute("INSERT OR REPLACE INTO optimizers VALUES(?,?,?,?)",
                         (rid, rank, r.opt, r.model_dump_json(exclude_none=True)))
            if r.opt not in st.optimizers:
                st.optimizers.append(r.opt)
            res.optimizers.append(OptimizerView(rank=rank, opt=r.opt, cls=r.cls,
                                                params=r.params, shapes=r.shapes,
                                                groups=r.groups, label=r.label))
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
    conn.executemany("INSERT OR REPLACE INTO steps VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                     step_rows)
    for opt, opt_rows in touched.items():
        _aggregate(conn, st, rank, opt, opt_rows)
    if changed:
        res.findings = st.verdict.findings()
    res.stored = len(new)
    st.steps += len(step_rows)
    st.max_seq[rank] = max(max_seq, max(it.seq for it in new))
    st.updated = max(st.updated, max(it.t for it in new))
    st.status = st.final_status() or "live"
    conn.execute(
        "UPDATE runs SET status=?, updated=?, steps=?, findings=?, ranks=?, optimizers=?, "
        "dropped=? WHERE rid=?",
        (st.status, st.updated, st.steps, len(st.finding_keys), json.dumps(sorted(st.ranks)),
         json.dumps(st.optimizers), sum(st.dropped.values()), rid))
    conn.execute("INSERT OR REPLACE INTO streams VALUES(?,?,?,?,?)",
                 (rid, rank, st.max_seq[rank], st.ended.get(rank), st.dropped.get(rank, 0)))


def _step_columns(rid: int, seq: int, r: Row) -> tuple[Any, ...]:
    # SQLite stores NaN as NULL; the ``nan`` bits keep NaN apart from "not measured"
    nan = ((r.norm != r.norm) * db.NAN_NORM | (r.fresh_norm != r.fresh_norm) * db.NAN_FRESH
           | (r.drift != r.drift) * db.NAN_DRIFT)
    resets = ";".join([f"{how}:{n}" for how, n in r.resets]) or None
    return (rid, r.rank, r.opt, r.step, seq, r.t, r.norm, r.fresh_norm, r.drift, nan,
            r.stale, r.leaked, r.late, r.discarded, int(r.skipped), resets)


def _aggregate(conn: sqlite3.Connection, st: RunState, rank: int, opt: str,
               rows: list[Row]) -> None:
    """Write ``step_agg`` rows for the chunks these new rows close.

    Steps of one (rank, opt) arrive in order, so a chunk is closed once a row of a later
    chunk arrives. Its summary comes from the rows buffered in memory, or from the
    database for a chunk begun before a restart or filled late (a resent gap).
    """
    key = (rank, opt)
    nxt = st.next_chunk.get(key)
    if nxt is None:
        conn.execute("INSERT OR IGNORE INTO series VALUES(?,?,?,0)", (st.rid, rank, opt))
        nxt = st.next_chunk[key] = 0
    redo: set[int] = set()
    closed: set[int] = set()
    for r in rows:
        c = r.step // db.CHUNK
        buf = st.chunk_rows.get(key)
        if c < nxt or (buf is not None and c < buf[0]):
            redo.add(c)
            continue
        if buf is not None and buf[0] == c:
            buf[1].append(r)
            continue
        if buf is not None:
            _close(conn, st, key, buf[0], buf[1], buf[2])
            closed.add(buf[0])
        st.chunk_rows[key] = (c, [r], c == nxt and st.loaded)
    buf = st.chunk_rows.get(key)
    top = buf[0] if buf is not None else nxt
    for c in sorted(redo | (set(range(nxt, top)) - closed)):
        if buf is None or c != buf[0]:
            _close(conn, st, key, c, [], True)
    if top > nxt:
        st.next_chunk[key] = top
        conn.execute("UPDATE series SET next_chunk=? WHERE rid=? AND rank=? AND opt=?",
                     (top, st.rid, rank, opt))


def _close(conn: sqlite3.Connection, st: RunState, key: tuple[int, str], c: int,
           rows: list[Row], from_db: bool) -> None:
    if from_db:
        rows = read_rows(conn, st.rid, key[0], key[1], c * db.CHUNK, (c + 1) * db.CHUNK - 1)
    if rows:
        conn.execute("INSERT OR REPLACE INTO step_agg VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                     (st.rid, *key, c, *chunk_summary(rows)))


STEP_SELECT = ("SELECT rank, opt, step, t, norm, fresh_norm, drift, nan, stale, leaked, "
               "late, discarded, skipped, resets FROM steps ")


def to_row(t: tuple[Any, ...]) -> Row:
    """A ``steps`` table row (as :data:`STEP_SELECT` reads it) as a :class:`Row`."""
    nan = t[7]
    return Row(t[0], t[1], t[2], t[3],
               _NAN if nan & db.NAN_NORM else t[4],
               _NAN if nan & db.NAN_FRESH else t[5],
               _NAN if nan & db.NAN_DRIFT else t[6],
               t[8], t[9], t[10], t[11], bool(t[12]),
               _resets(t[13]) if t[13] else ())


def _resets(text: str) -> tuple[tuple[str, int], ...]:
    out = []
    for part in text.split(";"):
        how, _, n = part.partition(":")
        out.append((how, int(n)))
    return tuple(out)


def read_rows(conn: sqlite3.Connection, rid: int, rank: int, opt: str, lo: int,
              hi: int) -> list[Row]:
    """Step rows of one (rank, opt) with ``lo <= step <= hi``, in step order."""
    cur = conn.execute(STEP_SELECT + "WHERE rid=? AND rank=? AND opt=? AND step BETWEEN ? "
                       "AND ? ORDER BY step", (rid, rank, opt, lo, hi))
    return [to_row(t) for t in cur]


def chunk_summary(rows: list[Row]) -> tuple[Any, ...]:
    """The ``step_agg`` columns (after the key) of one chunk's rows."""
    out: list[Any] = [len(rows)]
    for vals in ([(r.norm, r.step) for r in rows if r.norm is not None],
                 [(r.drift, r.step) for r in rows if r.drift is not None]):
        finite = [v for v in vals if math.isfinite(v[0])]
        if finite:
            lo, hi = min(finite), max(finite)  # ties: the earliest/latest step
            out += [lo[0], lo[1], hi[0], hi[1]]
        else:
            out += [None, None, None, None]
    flag = next((r.step for r in rows if is_flagged(r)), None)
    usual = Counter(reset_sig(r) for r in rows).most_common(1)[0][0]
    odd = next((r.step for r in rows if reset_sig(r) != usual), None)
    return (*out, flag, odd, json.dumps(usual))
