"""In-memory state of a run while it is being written: counters, streams and its Verdict.

The storage writer keeps one :class:`RunState` per recently written run. After a restart
the state is rebuilt from the database: counters from ``runs``/``streams``, chunk progress
from ``series``, and the :class:`~gradwatch.verdict.Verdict` by feeding it the header, the
optimizers, stats, ends and only the step records that carry a finding fact (the only
steps that change findings). Stored records are validated again as they are read back: the
database may have been written by another gradwatch version.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field

from gradwatch.frames import RunStatus, RunSummary
from gradwatch.server.chunks import ChunkSummaries
from gradwatch.server.steptable import FACTS_SQL
from gradwatch.verdict import Verdict
from gradwatch.wire import Header, parse_record


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

    def summary(self) -> RunSummary:
        """The run as the run list shows it."""
        return RunSummary(
            id=self.id, name=self.name, status=self.status, started=self.started,
            updated=self.updated, steps=self.steps, findings=len(self.finding_keys),
            ranks=sorted(self.ranks), optimizers=list(self.optimizers),
            dropped=sum(self.dropped.values()), torch_version=self.torch_version)

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


def new_state(rid: int, header: Header, name: str | None = None) -> RunState:
    """State of a run created from its first header."""
    return RunState(rid=rid, id=header.run, name=name or header.run_name or header.run,
                    status="live", started=header.started, updated=header.t,
                    torch_version=header.torch_version, world_size=header.world_size,
                    chunks=ChunkSummaries(rid))


def load_state(conn: sqlite3.Connection, run_id: str) -> RunState | None:
    """Rebuild a run's state from the database, or ``None`` if there is no such run."""
    row = conn.execute(
        "SELECT rid, id, name, status, started, updated, steps, ranks, optimizers, "
        "torch_version, world_size, header FROM runs WHERE id=?", (run_id,)).fetchone()
    if row is None:
        return None
    rid = row[0]
    nxt = {(rank, opt): c for rank, opt, c in conn.execute(
        "SELECT rank, opt, next_chunk FROM series WHERE rid=?", (rid,))}
    st = RunState(rid=rid, id=row[1], name=row[2], status=row[3], started=row[4],
                  updated=row[5], torch_version=row[9], world_size=row[10], steps=row[6],
                  ranks=json.loads(row[7]), optimizers=json.loads(row[8]),
                  chunks=ChunkSummaries(rid, nxt, loaded=True))
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
    st.verdict.feed(parse_record(row[11]), 0)
    for rank, body in conn.execute(
            "SELECT rank, body FROM records WHERE rid=? AND kind IN ('optimizer', 'site', "
            "'unowned', 'holding', 'stats', 'end') ORDER BY rank, seq", (rid,)):
        st.verdict.feed(parse_record(body), rank)
    for rank, body in conn.execute(
            "SELECT r.rank, r.body FROM steps s JOIN records r ON r.rid=s.rid AND "
            f"r.rank=s.rank AND r.seq=s.seq WHERE s.rid=? AND {FACTS_SQL} "
            "ORDER BY s.rank, s.seq", (rid,)):
        st.verdict.feed(parse_record(body), rank)
    return st
