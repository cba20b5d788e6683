"""Notes from other servers: merged per run while they wait, read only when watched."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import synth

from gradwatch.server.batch import IngestResult, batch_of
from gradwatch.server.remote import Change, RemoteFeed, merged, note_of
from gradwatch.server.storage import Store
from gradwatch.wire import IngestBatch


def note(run: str, rank: int | None = None, steps: list[int] | None = None,
         server: str = "B", **extra: Any) -> str:
    d: dict[str, Any] = {"from": server, "run": run, **extra}
    if rank is not None:
        d["rank"] = rank
    if steps is not None:
        d["steps"] = steps
    return json.dumps(d)


def test_batches_of_a_run_merge_into_one_read_per_contiguous_range() -> None:
    got = merged([note("r", 0, [0, 9]), note("q", 1, [5, 5]), note("r", 0, [10, 19]),
                  note("r", 1, [0, 9], opts=["opt"]), note("r", 0, [40, 49]),
                  note("r", 0, [20, 29], findings=True)], "A")
    assert [c.run for c in got] == ["r", "q"]
    r = got[0]
    assert r.steps == {0: [[0, 29], [40, 49]], 1: [[0, 9]]}
    assert r.opts == {1: {"opt"}} and r.findings and r.ranks() == [0, 1]
    assert got[1].steps == {1: [[5, 5]]} and not got[1].findings


def test_a_deletion_ends_a_runs_change_and_own_or_unreadable_notes_are_skipped(
        caplog: Any) -> None:
    got = merged([note("r", 0, [0, 9]), note("r", server="A", deleted=True),
                  "not json", note("r", deleted=True), note("r", 0, [0, 4]),
                  note("r", scalars=[])], "A")
    assert [(c.run, c.deleted, c.steps) for c in got] == [
        ("r", False, {0: [[0, 9]]}), ("r", True, {}), ("r", False, {0: [[0, 4]]})]
    assert "unreadable note" in caplog.text


class Counting:
    """A real reader, its reads counted (what the feed reads is the point of the test)."""

    def __init__(self, reader: Any) -> None:
        self.reader, self.reads = reader, list[str]()

    def __getattr__(self, name: str) -> Any:
        def read(*args: Any) -> Any:
            self.reads.append(name)
            return getattr(self.reader, name)(*args)
        return read


class Sink:
    """Where the feed publishes: what a server's own live clients would be handed."""

    def __init__(self, watched: set[str]) -> None:
        self.watched, self.results, self.gone = watched, list[IngestResult](), list[str]()

    def publish(self, res: IngestResult) -> None:
        self.results.append(res)

    def deleted(self, run: str) -> None:
        self.gone.append(run)

    def watching(self, run: str) -> bool:
        return run in self.watched


def stored_notes(store: Store) -> list[str]:
    """The notes another server ("B") would send for a two-rank run stored in batches of 5
    records (the second rank's steps go stale: a finding)."""
    notes = []
    for rank, stale in ((0, None), (1, 12)):
        recs = synth.records(steps=20, rank=rank, stale_from=stale)
        for i in range(0, len(recs), 5):
            res = store.call(store.ingest, batch_of(IngestBatch(run="run1", rank=rank,
                                                                records=recs[i:i + 5])))
            notes.append(note_of("B", "run1", res))
    return notes


def test_a_watched_runs_change_is_read_once_and_published_per_rank(sqlite_store: Store
                                                                   ) -> None:
    reader, sink = Counting(sqlite_store.reader), Sink({"run1"})
    feed = RemoteFeed("A", sqlite_store.database, reader, sink)  # type: ignore[arg-type]
    [change] = merged(stored_notes(sqlite_store), "A")
    asyncio.run(feed.publish(change))
    # ten batch notes: one read of each kind, one steps read per rank
    assert sorted(reader.reads) == ["findings", "optimizers", "steps", "steps", "summary"]
    assert [x.rank for x in sink.results] == [0, 1]
    for res in sink.results:
        assert [r.step for r in res.rows] == list(range(20))
        assert [v.opt for v in res.optimizers] == ["SGD#0"]
    last = sink.results[-1]
    assert last.findings == sqlite_store.reader.findings("run1") and last.findings
    assert last.summary == sqlite_store.reader.summary("run1")
    assert sink.results[0].findings is None and sink.results[0].summary is None


def test_nothing_is_read_for_a_run_nobody_here_watches_but_deletions_go_on(
        sqlite_store: Store) -> None:
    reader, sink = Counting(sqlite_store.reader), Sink(set())
    feed = RemoteFeed("A", sqlite_store.database, reader, sink)  # type: ignore[arg-type]
    notes = [*stored_notes(sqlite_store), note_of("B", "run1", deleted=True)]
    for change in merged(notes, "A"):
        asyncio.run(feed.publish(change))
    assert reader.reads == [] and sink.results == [] and sink.gone == ["run1"]
    assert Change("q").ranks() == []
