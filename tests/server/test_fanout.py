"""The fan-out module directly: bounded queues, decimation, rate-limited summaries."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest
import synth

from gradwatch.frames import RunSummary
from gradwatch.server import fanout
from gradwatch.server.fanout import Hub


def rows(lo: int, hi: int) -> list:
    return [synth.row_from_step(synth.step(i + 2, i), 0) for i in range(lo, hi)]


def summary(steps: int, run: str = "run1") -> RunSummary:
    return RunSummary(id=run, name="r", status="live", started=0, updated=0, steps=steps,
                      findings=0, ranks=[0], optimizers=[], dropped=0, torch_version="")


async def test_fast_client_gets_every_row_while_a_stuck_one_stays_bounded() -> None:
    hub = Hub(max_items=8, max_rows=100)
    fast, stuck = hub.subscribe("run1"), hub.subscribe("run1")
    other = hub.subscribe("run2")
    assert fast and stuck and other
    got: list[int] = []
    for k in range(200):  # 200 batches of 10 steps; the stuck client never reads
        hub.publish_steps("run1", rows(k * 10, k * 10 + 10))
        for text in await fast.next():
            got += json.loads(text)["steps"]["step"]
    assert got == list(range(2000))
    assert stuck.pending() <= 8 + 1 and stuck.decimated > 0 and other.pending() == 0
    frames = [json.loads(t) for t in await stuck.next()]
    steps = [s for f in frames for s in f["steps"]["step"]]
    assert any(f["decimated"] for f in frames)
    assert len(steps) < 400 and steps == sorted(steps) and steps[-1] == 1999


async def test_decimation_keeps_spikes() -> None:
    hub = Hub(max_items=4, max_rows=60)
    c = hub.subscribe("run1")
    assert c
    batch = rows(0, 1000)
    batch[617] = batch[617]._replace(norm=1e9)
    for i in range(0, 1000, 50):
        hub.publish_steps("run1", batch[i:i + 50])
    frames = [json.loads(t) for t in await c.next()]
    steps = [s for f in frames for s in f["steps"]["step"]]
    assert 617 in steps
    decimated = [f["steps"] for f in frames if f["decimated"]]
    assert decimated and all(d["downsampled"] and d["bucket"] > 1 for d in decimated)
    assert all(d["total"] > len(d["step"]) for d in decimated)


async def test_summaries_are_rate_limited_but_the_last_one_arrives() -> None:
    hub = Hub(summary_interval=0.1)
    lst = hub.subscribe(None)
    assert lst
    for i in range(50):
        hub.publish_summary(summary(i))
    first = [json.loads(t) for t in await lst.next()]
    assert [f["run"]["steps"] for f in first] == [0]
    await asyncio.sleep(0.2)
    later = [json.loads(t) for t in await lst.next()]
    assert [f["run"]["steps"] for f in later] == [49]


async def test_client_limit_and_skip_of_rows_a_snapshot_had() -> None:
    hub = Hub(max_clients=1)
    c = hub.subscribe("run1")
    assert c and hub.subscribe("run1") is None
    c.skip_until = {(0, "SGD#0"): 14}
    hub.publish_steps("run1", rows(10, 20))
    hub.publish_steps("run1", rows(20, 25))
    frames = [json.loads(t) for t in await c.next()]
    assert [s for f in frames for s in f["steps"]["step"]] == list(range(15, 25))
    hub.unsubscribe(c)
    assert hub.clients() == 0


async def test_stuck_clients_cost_the_publisher_no_merging_and_are_dropped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    merged_on: list[str] = []
    real = fanout.downsample

    def spy(rows: Any, max_points: int) -> Any:
        merged_on.append(threading.current_thread().name)
        return real(rows, max_points)

    monkeypatch.setattr(fanout, "downsample", spy)
    hub = Hub(max_items=8, max_rows=100, max_backlog=20_000)
    stuck = [hub.subscribe("run1") for _ in range(50)]
    slow = hub.subscribe("run1")
    assert slow and all(stuck)
    for k in range(900):  # 9,000 rows: past every queue, within the backlog
        hub.publish_steps("run1", rows(k * 10, k * 10 + 10))
    assert merged_on == []  # publishing only set rows aside, for 51 clients
    frames = [json.loads(t) for t in await slow.next()]  # the slow client reads at last
    steps = [s for f in frames for s in f["steps"]["step"]]
    assert steps == sorted(steps) and steps[0] == 0 and steps[-1] == 8999
    assert frames[-1]["decimated"] and frames[-1]["steps"]["total"] == 9000 - 80
    assert merged_on and merged_on[0] != threading.main_thread().name  # merged off the loop
    for k in range(900, 3100):  # the stuck ones fall more than 20,000 rows behind
        hub.publish_steps("run1", rows(k * 10, k * 10 + 10))
    for c in stuck:
        assert c is not None and c.too_slow and "20000 step rows behind" in c.too_slow
        assert c.pending() == 0 and await c.next() == []  # its route closes it (1013)


async def test_a_slow_run_list_keeps_the_newest_state_of_every_run() -> None:
    hub = Hub(summary_interval=0.0, max_items=2)
    lst = hub.subscribe(None)
    assert lst
    for i in range(5):
        for run in ("a", "b", "c"):
            hub.publish_summary(summary(i, run))
    got = [json.loads(t)["run"] for t in await lst.next()]
    newest = {r["id"]: r["steps"] for r in got}
    assert newest == {"a": 4, "b": 4, "c": 4}
