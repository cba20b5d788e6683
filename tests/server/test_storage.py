"""The storage module directly: once-only records, restart, limits, downsampling."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import synth

from gradwatch.frames import StepSeries, frame_json
from gradwatch.server.batch import batch_of
from gradwatch.server.db import CHUNK
from gradwatch.server.downsampling import bucket_size
from gradwatch.server.errors import InvalidStream, RunLimitReached
from gradwatch.server.reader import Reader
from gradwatch.server.storage import Store
from gradwatch.wire import IngestBatch

Where = Path | str


def feed(store: Store, recs: list, run: str = "run1", rank: int = 0,
         size: int = 100) -> list:
    return [store.call(store.ingest, batch(recs[i:i + size], run, rank))
            for i in range(0, len(recs), size)]


def batch(recs: list, run: str = "run1", rank: int = 0) -> Any:
    return batch_of(IngestBatch(run=run, rank=rank, records=recs))


def steps(reader: Reader, run: str = "run1", **kw: Any) -> StepSeries:
    """The run's steps as the server sends them (the JSON, validated here)."""
    got = reader.steps(run, **kw)
    assert got is not None
    return StepSeries.model_validate_json(frame_json(StepSeries, **got.columns()))


def test_resends_and_overlaps_store_each_record_once(store: Store, where: Where) -> None:
    recs = synth.records(steps=500, stale_from=300)
    feed(store, recs[:300])
    res = feed(store, recs[250:], size=33)  # overlaps what is stored
    feed(store, recs)  # a full resend
    assert res[-1].ack == len(recs) - 1
    r = Reader(where)
    s = steps(r, max_points=100_000)
    assert s.step == list(range(500))
    summary = r.summary("run1")
    assert summary is not None and summary.steps == 500 and summary.status == "finished"
    f = r.findings("run1")
    assert f is not None and f[0].steps == 200 and f[0].first_step == 300


def check_extremes(s: Any, norms: dict[int, float]) -> None:
    """Every bucket keeps its own min and max norm: compared with a plain loop."""
    n = len(norms)
    for lo in range(0, n, s.bucket):
        bucket = [norms[i] for i in range(lo, min(n, lo + s.bucket))]
        kept = [x for st, x in zip(s.step, s.norm, strict=True) if lo <= st < lo + s.bucket]
        assert max(kept) == max(bucket) and min(kept) == min(bucket), lo


def test_survives_restart_and_resumes_judging(where: Where) -> None:
    recs = synth.records(steps=400, stale_from=100)
    s1 = Store(where)
    s1.start()
    feed(s1, recs[:250])
    s1.close()
    s2 = Store(where)  # a restart: the run was live, so it reads as interrupted
    s2.start()
    r = Reader(where)
    assert r.summary("run1").status == "interrupted"  # type: ignore[union-attr]
    assert s2.call(s2.resume_seq, "run1", 0) == 249
    feed(s2, recs[200:])
    s2.close()
    got = Reader(where)
    assert got.summary("run1").status == "finished"  # type: ignore[union-attr]
    f = got.findings("run1")
    assert f is not None and f[0].steps == 300 and f[0].first_step == 100
    assert steps(got, max_points=100_000).step == list(range(400))
    check_extremes(steps(got, max_points=60), {i: recs[2 + i].norm for i in range(400)})


def test_chunk_summaries_survive_a_restart_mid_chunk(where: Where) -> None:
    recs = synth.records(steps=5000, end=False)
    for i in (100, 1037, 1038, 4321):  # spikes around the restart point and later
        recs[2 + i] = recs[2 + i].model_copy(update={"norm": 50.0 + i})
    s1 = Store(where)
    s1.start()
    feed(s1, recs[:1040], size=1000)  # stops in the middle of a chunk
    s1.close()
    s2 = Store(where)
    s2.start()
    feed(s2, recs[1000:], size=700)
    s2.close()
    s = steps(Reader(where), max_points=400)
    assert s.bucket >= 64 and s.total == 5000
    check_extremes(s, {i: recs[2 + i].norm for i in range(5000)})


def test_bad_batch_is_refused_whole(store: Store, where: Where) -> None:
    recs = synth.records(steps=20)
    feed(store, recs[:10])
    bad = [recs[12], recs[11]]
    with pytest.raises(InvalidStream, match="increasing seq order"):
        store.call(store.ingest, batch(bad))
    assert Reader(where).summary("run1").steps == 8  # type: ignore[union-attr]


def test_run_limit_and_several_ranks(where: Where) -> None:
    store = Store(where, max_runs=1)
    store.start()
    feed(store, synth.records("job", steps=10, rank=0, world_size=2, end=True), "job", 0)
    assert Reader(where).summary("job").status == "live"  # type: ignore[union-attr]
    feed(store, synth.records("job", steps=7, rank=1, world_size=2), "job", 1)
    with pytest.raises(RunLimitReached, match="run limit"):
        feed(store, synth.records("other", steps=1), "other")
    store.close()
    s = Reader(where).summary("job")
    assert s is not None and s.ranks == [0, 1] and s.steps == 17 and s.status == "finished"
    assert steps(Reader(where), "job", rank=1).rank == [1] * 7


def test_nan_and_none_norms_survive(store: Store, where: Where) -> None:
    recs = synth.records(steps=5, nan_at=2)
    recs[5] = recs[5].model_copy(update={"norm": None, "drift": math.inf})
    feed(store, recs)
    s = steps(Reader(where))
    assert math.isnan(s.norm[2]) and s.norm[3] is None and s.drift[3] == math.inf


def test_million_step_style_query_uses_chunk_summaries(store: Store, where: Where) -> None:
    # 20 steps a point, as a million steps on a wide chart: buckets of whole chunks (128
    # steps), read off their summaries.
    n, points = 12_000, 600
    assert bucket_size(0, n - 1, points, align=CHUNK) == 2 * CHUNK
    recs = synth.records(steps=n, end=False)
    recs[2 + 8_234] = recs[2 + 8_234].model_copy(update={"norm": 99.0})
    recs[2 + 1_777] = recs[2 + 1_777].model_copy(update={"norm": -5.0})
    feed(store, recs, size=5000)
    s = steps(Reader(where), max_points=points)
    assert s.downsampled and s.total == n and len(s.step) <= points
    assert 8_234 in s.step and 1_777 in s.step and s.step == sorted(s.step)
    assert (s.step[0], s.step[-1]) == (0, n - 1)  # the chart spans the whole run
    check_extremes(s, {i: recs[2 + i].norm for i in range(n)})


def test_delete_removes_everything(store: Store, where: Where) -> None:
    feed(store, synth.records(steps=10))
    assert store.call(store.delete, "run1") is True
    assert store.call(store.delete, "run1") is False
    assert Reader(where).runs() == []
    feed(store, synth.records(steps=3))  # the id can be used again
    assert Reader(where).summary("run1").steps == 3  # type: ignore[union-attr]
