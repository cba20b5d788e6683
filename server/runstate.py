"""In-memory state of a run while it is being written: counters, streams and its Verdict.

The storage writer keeps one :class:`RunState` per recently written run. After a restart
the state is rebuilt from the database: counters from ``runs``/``streams``, series and
chunk progress from ``series``, and the :class:`~gradwatch.verdict.Verdict` by feeding it
the header, the optimizers, sites, lifecycle records, stats, ends and only the steps that
carry a finding fact (the only steps that change findings), rebuilt from their columns.
Stored records are validated again as they are read back: the database may have been
written by another gradwatch version.
"""

from __future__ import annotations

import heapq
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gradwatch.frames import RunStatus, RunSummary
from gradwatch.server.chunks import ChunkSummaries
from gradwatch.server.steptable import FACTS_SQL, RECORD_SELECT, step_record
from gradwatch.verdict import Verdict
from gradwatch.wire import Header, Step, parse_record

if TYPE_CHECKING:
    from gradwatch.server.backend import Conn


@dataclass
class RunState:
    """Counters and verdict of one run, mirrored in the ``runs`` and ``streams`` rows."""

    rid: int
    id: str
    name: str
    status: RunStatus
    started: float
    updated: float
    torch_version: str
    world_size: int
    chunks: ChunkSummaries
    """Its series' chunk summaries (``step_agg``)."""
    keep_new: int = 1
    """``keep_every`` of a series this run starts (``--keep-param-norms every N``)."""
    steps: int = 0
    ranks: list[int] = field(default_factory=list)
    optimizers: list[str] = field(default_factory=list)
    max_seq: dict[int, int] = field(default_factory=dict)
    """Per rank: the highest seq stored."""
    acked: dict[int, int] = field(default_factory=dict)
    """Per rank: the ack, every record up to it stored (:mod:`server.prefix`)."""
    keys: dict[int, str] = field(default_factory=dict)
    """Per rank: the hash of the key that owns the stream (:mod:`server.owners`)."""
    ended: dict[int, str] = field(default_factory=dict)
    dropped: dict[int, int] = field(default_factory=dict)
    finding_keys: set[tuple[int, str, str]] = field(default_factory=set)
    verdict: Verdict = field(default_factory=Verdict)
    sids: dict[tuple[int, str], int] = field(default_factory=dict)
    """Series id of each (rank, opt)."""
    keep_every: dict[int, int] = field(default_factory=dict)
    """Per series: per-parameter norms are kept of every N-th step (and must-keep ones)."""
    last_step: dict[int, int] = field(default_factory=dict)
    """Per series: its highest stored step."""
    notes: str = ""
    tags: list[str] = field(default_factory=list)
    gen: int = 0
    """The run's write generation this state reflects (servers sharing a database:
    :meth:`server.backend.Database.generation`)."""

    def summary(self) -> RunSummary:
        """The run as the run list shows it."""
        return RunSummary(
            id=self.id, name=self.name, status=self.status, started=self.started,
            updated=self.updated, steps=self.steps, findings=len(self.finding_keys),
            ranks=sorted(self.ranks), optimizers=list(self.optimizers),
            dropped=sum(self.dropped.values()), torch_version=self.torch_version,
            notes=self.notes, tags=list(self.tags),
            stopped=self.verdict.stopped_text())

    def final_status(self) -> RunStatus | None:
        """The run's end status once every rank has sent its End, else ``None``."""
        if not self.ranks or len(self.ranks) < self.world_size:
            return None
        if any(r not in self.ended for r in self.ranks):
            return None
        ends = set(self.ended.values())
        if "failed" in ends:
            return "failed"
        if "interrupted" in ends:
            return "interrupted"
        return "finished"

    def series(self, conn: Conn, rank: int, opt: str) -> int:
        """The series id of (rank, opt), creating the series the first time."""
        sid = self.sids.get((rank, opt))
        if sid is None:
            cur = conn.execute("INSERT INTO series(rid, rank, opt, next_chunk, keep_every) "
                               "VALUES(?,?,?,0,?)", (self.rid, rank, opt, self.keep_new))
            assert cur.lastrowid is not None
            sid = self.sids[(rank, opt)] = cur.lastrowid
            self.keep_every[sid] = self.keep_new
            self.chunks.next_chunk[sid] = 0
        return sid


def new_state(rid: int, header: Header, name: str | None = None,
              keep_every: int = 1) -> RunState:
    """State of a run created from its first header."""
    return RunState(rid=rid, id=header.run, name=name or header.run_name or header.run,
                    status="live", started=header.started, updated=header.t,
                    torch_version=header.torch_version, world_size=header.world_size,
                    chunks=ChunkSummaries(), keep_new=keep_every, notes=header.notes,
                    tags=list(header.tags))


def load_state(conn: Conn, run_id: str, keep_every: int = 1
               ) -> RunState | None:
    """Rebuild a run's state from the database, or ``None`` if there is no such run."""
    row = conn.execute(
        "SELECT rid, id, name, status, started, updated, steps, ranks, optimizers, "
        "torch_version, world_size, header, notes, tags FROM runs WHERE id=?",
        (run_id,)).fetchone()
    if row is None:
        return None
    rid = row[0]
    st = RunState(rid=rid, id=row[1], name=row[2], status=row[3], started=row[4],
                  updated=row[5], torch_version=row[9], world_size=row[10], steps=row[6],
                  ranks=json.loads(row[7]), optimizers=json.loads(row[8]),
                  chunks=ChunkSummaries(loaded=True), keep_new=keep_every, notes=row[12],
                  tags=json.loads(row[13]))
    opts: dict[int, tuple[int, str]] = {}
    for sid, rank, opt, nxt, keep in conn.execute(
            "SELECT sid, rank, opt, next_chunk, keep_every FROM series WHERE rid=?", (rid,)):
        st.sids[(rank, opt)] = sid
        st.keep_every[sid] = keep
        st.chunks.next_chunk[sid] = nxt
        opts[sid] = (rank, opt)
        last = conn.execute("SELECT max(step) FROM steps WHERE sid=?", (sid,)).fetchone()[0]
        if last is not None:
            st.last_step[sid] = last
    for rank, max_seq, ended, dropped, acked, key_hash in conn.execute(
            "SELECT rank, max_seq, ended, dropped, acked, key_hash FROM streams "
            "WHERE rid=?", (rid,)):
        st.max_seq[rank] = max_seq
        # No ack column before keys: those servers acked the highest seq; keep it.
        st.acked[rank] = max_seq if acked is None else acked
        if key_hash is not None:
            st.keys[rank] = key_hash
        st.dropped[rank] = dropped
        if ended:
            st.ended[rank] = ended
    for rank, opt, kind in conn.execute(
            "SELECT rank, opt, kind FROM findings WHERE rid=?", (rid,)):
        st.finding_keys.add((rank, opt, kind))
    st.verdict.feed(parse_record(row[11], 1), 0)
    # The verdict reads each stream in seq order: its records and flagged steps merged.
    streams: list[Any] = [
        ((rank, seq, 0, body) for rank, seq, body in conn.execute(
            "SELECT rank, seq, body FROM records WHERE rid=? AND kind IN ('optimizer', "
            "'site', 'unowned', 'holding', 'stats', 'end') ORDER BY rank, seq", (rid,)))]
    flagged = []
    for sid, (rank, opt) in opts.items():
        for t in conn.execute(RECORD_SELECT + f"WHERE s.sid=? AND {FACTS_SQL}", (sid,)):
            flagged.append((rank, t[0], 1, step_record(opt, t)))
    flagged.sort(key=lambda x: (x[0], x[1]))
    streams.append(flagged)
    for rank, _, kind, rec in heapq.merge(*streams, key=lambda x: (x[0], x[1])):
        st.verdict.feed(parse_record(rec, 1) if kind == 0 else Step.model_validate(rec), rank)
    return st
