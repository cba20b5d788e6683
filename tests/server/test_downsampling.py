"""The row rules: which rows a plot must keep, and min/max downsampling, each written once.

The Python rules answer the hand-worked fixture (``rows_fixture.json``, which the
dashboard's copy in ``web/js/series.js`` answers too: tests/web/test_series_rules.py); the
database's SQL forms and chunk summaries answer exactly what the pure rules answer.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import synth

from gradwatch.frames import StepSeries
from gradwatch.server import db
from gradwatch.server.batch import batch_of_records
from gradwatch.server.downsampling import downsample
from gradwatch.server.reader import Reader
from gradwatch.server.rows import Row, must_keep
from gradwatch.server.steptable import FACTS_SQL, MUST_KEEP_SQL
from gradwatch.server.storage import Store
from gradwatch.verdict import has_finding_facts
from gradwatch.wire import Header, Reset, Step

FIXTURE = json.loads((Path(__file__).with_name("rows_fixture.json")).read_text())


def fixture_rows() -> list[Row]:
    ss = StepSeries.model_validate(FIXTURE["rows"])
    cut = Row._fields.index("resets")
    return [Row(*(getattr(ss, f)[i] for f in Row._fields[:cut]),
                tuple((r.how, r.n) for r in ss.resets[i])) for i in range(len(ss.step))]


def step_of(r: Row, seq: int) -> Step:
    """A step record whose row is ``r``."""
    return Step(seq=seq, t=r.t, opt=r.opt, step=r.step, skipped=r.skipped, stale=r.stale,
                leaked=r.leaked, late_params=list(range(r.late)), discarded=r.discarded,
                resets=[Reset(how=h, params=list(range(n))) for h, n in r.resets],  # type: ignore[arg-type]
                norm=r.norm, fresh_norm=r.fresh_norm, drift=r.drift)


def stream(rows: list[Row], rank: int = 0) -> list[Any]:
    """The records of one rank's stream: its header, then a step per row."""
    return [Header(seq=0, t=0.0, run="run1", run_name="run1", rank=rank,
                   torch_version="2.13.0", gradwatch_version="0.1.0", started=0.0),
            *(step_of(r, 1 + i) for i, r in enumerate(rows))]


def send(store: Store, recs: list[Any], rank: int = 0, size: int = 500) -> None:
    for i in range(0, len(recs), size):
        store.call(store.ingest, batch_of_records("run1", rank, recs[i:i + size]))


def store_rows(store: Store, rows: list[Row]) -> None:
    send(store, stream(rows))


def same(a: float | None, b: float | None) -> bool:
    return a == b or (a is not None and b is not None and math.isnan(a) and math.isnan(b))


def assert_same_rows(got: list[Row], want: list[Row]) -> None:
    assert [(r.rank, r.opt, r.step) for r in got] == [(r.rank, r.opt, r.step) for r in want]
    for g, w in zip(got, want, strict=True):
        assert all(same(x, y) if isinstance(y, float) else x == y
                   for x, y in zip(g, w, strict=True)), (g, w)


def test_must_keep_answers_the_fixture() -> None:
    assert [must_keep(r) for r in fixture_rows()] == FIXTURE["must_keep"]


@pytest.mark.parametrize("case", FIXTURE["downsample"], ids=lambda c: str(c["max_points"]))
def test_downsampling_answers_the_fixture(case: dict[str, Any]) -> None:
    kept, bucket = downsample(fixture_rows(), case["max_points"])
    assert [r.step for r in kept] == case["kept"] and bucket == case["bucket"]


def test_the_sql_forms_of_the_rules_answer_as_the_python_rules(where: Path | str) -> None:
    rows = fixture_rows()
    store = Store(where)
    store.start()
    store_rows(store, rows)
    store.close()
    conn = Reader(where).database.open_reader()  # each backend's query form
    got = dict(conn.execute(f"SELECT step, {MUST_KEEP_SQL} FROM steps"))
    facts = dict(conn.execute(f"SELECT step, {FACTS_SQL} FROM steps"))
    conn.close()
    assert [bool(got[r.step]) for r in rows] == FIXTURE["must_keep"]
    assert [bool(facts[r.step]) for r in rows] == [has_finding_facts(step_of(r, 1))
                                                   for r in rows]
    assert any(facts.values()) and not all(facts.values())


@pytest.mark.parametrize("case", FIXTURE["downsample"], ids=lambda c: str(c["max_points"]))
def test_stored_series_downsample_to_the_fixture(where: Path | str, case: dict[str, Any]
                                                 ) -> None:
    store = Store(where)
    store.start()
    store_rows(store, fixture_rows())
    store.close()
    got = Reader(where).steps("run1", max_points=case["max_points"])
    assert got is not None and [r.step for r in got.rows] == case["kept"]
    assert got.bucket == case["bucket"] and got.total == len(FIXTURE["rows"]["step"])


def random_rows(rng: random.Random, rank: int, opt: str, n: int) -> list[Row]:
    """Rows with gaps, repeated values (ties), NaN/inf/missing norms, facts and resets."""
    kinds = [(("optimizer_zero_grad", 3),), (), (("module_zero_grad", 3),),
             (("set_none", 1), ("optimizer_zero_grad", 3))]
    rows, step = [], rng.randrange(0, 40)
    for _ in range(n):
        step += 1 if rng.random() < 0.9 else rng.randrange(2, 200)
        x = rng.random()
        norm = (float("nan") if x < 0.02 else math.inf if x < 0.03 else None if x < 0.06
                else float(rng.randrange(0, 50)) / 4)
        drift = -math.inf if rng.random() < 0.01 else float(rng.randrange(0, 30)) / 8
        fact = rng.random() < 0.03
        rows.append(Row(rank, opt, step, float(step), norm, 1.0, drift,
                        2 if fact and rng.random() < 0.5 else 0, 1 if fact else 0, 0, 0,
                        rng.random() < 0.005,
                        kinds[0] if rng.random() < 0.8 else rng.choice(kinds)))
    return rows


def test_stored_series_downsample_exactly_as_the_rule(where: Path | str) -> None:
    rng = random.Random(19)
    series = [random_rows(rng, 0, "A", 6000), random_rows(rng, 0, "B", 900),
              random_rows(rng, 1, "A", 3000)]
    a, b, c = series
    rank0 = stream(a[:2500] + b[:300] + a[2500:] + b[300:])
    store = Store(where)
    store.start()
    send(store, rank0[:2801], size=700)
    send(store, stream(c, rank=1), rank=1, size=1000)
    store.close()  # a restart in the middle of a chunk
    store = Store(where)
    store.start()
    # The rest, with a gap (rows 4000-4199 of A) sent last, as a probe resending it would.
    gap = rank0[4001:4201]
    send(store, rank0[2801:4001] + rank0[4201:], size=900)
    send(store, gap, size=150)
    store.close()

    reader = Reader(where)
    every = [r for s in series for r in s]
    for lo, hi in ((None, None), (700, 30_000), (50, 300), (a[3000].step, a[3000].step)):
        window = [r for r in every if (lo is None or r.step >= lo) and (hi is None or r.step <= hi)]
        for max_points in (60, 400, 1000, 2999, 100_000):
            got = reader.steps("run1", start=lo, end=hi, max_points=max_points)
            assert got is not None
            want, bucket = downsample(window, max_points, align=db.CHUNK)
            assert_same_rows(got.rows, want)
            assert (got.bucket, got.total) == (bucket, len(window))
    assert reader.steps("run1", max_points=60).bucket >= db.CHUNK  # type: ignore[union-attr]


def test_summaries_of_an_older_version_are_rebuilt(tmp_path: Path) -> None:
    """A schema 2 file whose chunk summaries are of the older form (user_version 0)."""
    shutil.copyfile(Path(__file__).parent / "fixtures" / "release-current.db",
                    tmp_path / db.DB_NAME)
    conn = sqlite3.connect(tmp_path / db.DB_NAME)
    conn.execute("UPDATE step_agg SET sig='[\"optimizer_zero_grad\"]', odd_step=NULL, "
                 "mx_norm_step=mn_norm_step")
    conn.execute("PRAGMA user_version=0")
    conn.commit()
    conn.close()
    Store(tmp_path).close()
    r = Reader(tmp_path)
    every = r.steps("alpha", opt="Adam#0", rank=0, max_points=100_000)
    got = r.steps("alpha", opt="Adam#0", rank=0, max_points=3)
    assert every is not None and got is not None and got.bucket >= db.CHUNK
    assert_same_rows(got.rows, downsample(every.rows, 3, align=db.CHUNK)[0])


def test_per_parameter_norms_downsample_alike_on_both_backends(
        tmp_path: Path, pg_cluster: Any) -> None:
    """The per-bucket step of largest norm has a query form per backend: same answers
    (ties, NaN and missing norms included)."""
    rng = random.Random(7)
    recs = synth.records(steps=3000, end=False)
    for i in rng.sample(range(3000), 300):  # ties within buckets, NaN and missing norms
        x = rng.random()
        recs[2 + i] = recs[2 + i].model_copy(update={
            "norm": math.nan if x < 0.1 else None if x < 0.2 else 5.0})
    got = []
    for where in (tmp_path, pg_cluster.new_database()):
        store = Store(where)
        store.start()
        send(store, recs, size=1000)
        store.close()
        r = Reader(where)
        got.append([r.params("run1", "SGD#0", max_points=m, start=lo) for m, lo in
                    ((40, None), (7, None), (300, 1500), (5000, None))])
        r.close()
    assert got[0] == got[1]
    assert got[0][0] is not None and got[0][0].bucket > 1 and len(got[0][0].step) > 10
