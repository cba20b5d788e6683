"""Notes from other servers: merged per run while they wait, read only when watched."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from gradwatch.server.batch import IngestResult
from gradwatch.server.remote import Change, RemoteFeed, merged


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


class Reader:
    """Answers what the feed reads, counting the reads."""

    def __init__(self) -> None:
        self.reads: list[tuple[Any, ...]] = []

    def summary(self, run: str) -> str:
        self.reads.append(("summary", run))
        return f"summary of {run}"

    def steps(self, run: str, lo: int, hi: int, *rest: Any) -> Any:
        self.reads.append(("steps", run, lo, hi, rest[-1]))
        return type("Got", (), {"rows": list(range(lo, hi + 1))})()

    def optimizers(self, run: str) -> list[Any]:
        self.reads.append(("optimizers", run))
        return []

    def findings(self, run: str) -> list[Any]:
        self.reads.append(("findings", run))
        return ["a finding"]


class Sink:
    def __init__(self, watched: set[str]) -> None:
        self.watched, self.results, self.gone = watched, list[IngestResult](), list[str]()

    def publish(self, res: IngestResult) -> None:
        self.results.append(res)

    def deleted(self, run: str) -> None:
        self.gone.append(run)

    def watching(self, run: str) -> bool:
        return run in self.watched


def test_a_watched_runs_change_is_read_once_and_published_per_rank() -> None:
    reader, sink = Reader(), Sink({"r"})
    feed = RemoteFeed("A", None, reader, sink)  # type: ignore[arg-type]
    change = merged([note("r", 0, [0, 2]), note("r", 1, [0, 1], findings=True),
                     note("r", 0, [3, 4])], "A")[0]
    asyncio.run(feed.publish(change))
    assert reader.reads == [("findings", "r"), ("summary", "r"), ("steps", "r", 0, 4, 0),
                            ("steps", "r", 0, 1, 1)]
    assert [(x.rank, x.rows, x.findings, x.summary) for x in sink.results] == [
        (0, [0, 1, 2, 3, 4], None, None), (1, [0, 1], ["a finding"], "summary of r")]


def test_nothing_is_read_for_a_run_nobody_here_watches_but_deletions_go_on() -> None:
    reader, sink = Reader(), Sink(set())
    feed = RemoteFeed("A", None, reader, sink)  # type: ignore[arg-type]
    for change in merged([note("q", 0, [0, 99], findings=True), note("q", deleted=True)],
                         "A"):
        asyncio.run(feed.publish(change))
    assert reader.reads == [] and sink.results == [] and sink.gone == ["q"]
    assert Change("q").ranks() == []
