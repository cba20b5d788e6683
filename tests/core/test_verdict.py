"""The verdict: step facts become grouped findings with the contract's fields."""

from __future__ import annotations

from typing import Any

from gradwatch.verdict import Verdict, verdict_of
from gradwatch.wire import Reset
from tests.core.logs import clean_log, header, missed_reset_log, optimizer, step


def test_clean_run_has_no_findings() -> None:
    j = verdict_of([header(), *clean_log(10)])
    assert j.findings() == []
    s = j.summary()
    assert s["steps"] == 10 and s["findings"] == 0 and s["status"] == "finished"


def test_missed_reset_is_one_finding_spanning_its_steps() -> None:
    [f] = verdict_of([header(), *missed_reset_log()]).findings()
    assert (f.kind, f.optimizer, f.first_step, f.last_step, f.steps) == (
        "missed_reset", "SGD#0", 1, 3, 3)
    assert f.params == ["w", "b"]
    assert "zero_grad" in f.fix and "12 stale" in f.message
    assert "held 4 backward passes" in f.message


def test_each_fact_maps_to_its_kind() -> None:
    recs: list[Any] = [
        optimizer("D"), optimizer("G", seq=2),
        step(3, 0, opt="D", leaked=1, leaked_params=[1]),
        step(4, 0, opt="G", late_params=[0], fresh=0,
             resets=[Reset(how="optimizer_zero_grad", params=[0, 1], after_backward=True)]),
        step(5, 1, opt="G", discarded=3, discarded_params=[0]),
    ]
    kinds = {(f.kind, f.optimizer, tuple(f.params)) for f in verdict_of(recs).findings()}
    assert kinds == {
        ("cross_optimizer_leak", "D", ("b",)),
        ("late_reset", "G", ("w",)),
        ("discarded_accumulation", "G", ("w",)),
    }


def test_ranks_are_judged_separately() -> None:
    j = Verdict()
    for rank in (0, 1):
        j.feed(optimizer(), rank)
    j.feed(step(2, 4, stale=1, stale_params=[0]), 1)
    [f] = j.findings()
    assert f.rank == 1 and f.first_step == 4 and f.params == ["w"]


def test_feed_returns_the_findings_a_record_changed() -> None:
    j = Verdict()
    j.feed(optimizer())
    assert j.feed(step(2, 0)) == []
    [changed] = j.feed(step(3, 1, stale=2, stale_params=[0, 1]))
    assert changed.steps == 1
    [changed] = j.feed(step(4, 2, stale=4, stale_params=[0, 1]))
    assert changed.steps == 2
