"""The verdict: step facts become grouped findings with the contract's fields."""

from __future__ import annotations

from typing import Any

from gradwatch.verdict import Verdict, verdict_of
from gradwatch.wire import Reset, Site, StepSites
from tests.core.logs import clean_log, header, missed_reset_log, no_step_log, optimizer, step


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
    assert "zero_grad" in f.fix
    # in backward passes, not per-parameter contributions: one pass writes both params
    assert "step 3 applied the gradients of 4 backward passes; only the last one was new" \
        in f.message
    assert "contribution" not in f.message


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


def test_the_worst_step_is_counted_as_the_log_shows_it_with_several_backwards() -> None:
    """Accumulation over 4 backwards, zero_grad forgotten: step k reads the gradients of
    4 (k + 1) backward passes, of which its own 4 are new. The message says so (not "21
    backward passes' worth where 1 was fresh", the ratio misread as passes)."""
    recs: list[Any] = [optimizer(params=("w",))]
    for k in range(21):
        recs.append(step(2 + k, k, backwards=4, consumed=4 * (k + 1), fresh=4,
                         stale=4 * k, stale_params=[0] if k else []))
    [f] = verdict_of(recs).findings()
    assert ("step 20 applied the gradients of 84 backward passes; only the last 4 were new"
            in f.message)
    assert "21" not in f.message


def test_findings_name_optimizers_by_label_and_keep_ids_for_params() -> None:
    j = verdict_of([optimizer("Adam#1", ("dec.0.weight",), label="dec_opt"),
                    step(2, 0, opt="Adam#1", stale=1, stale_params=[0])])
    [f] = j.findings()
    assert (f.optimizer, f.params) == ("dec_opt", ["dec.0.weight"])
    assert f.message.startswith("dec_opt ")


def test_nothing_judged_says_why() -> None:
    assert verdict_of([header(), *clean_log(1)]).nothing_judged() is None
    assert "never stepped" in (verdict_of(no_step_log()).nothing_judged() or "")
    failed = verdict_of(no_step_log("failed", 2)).nothing_judged() or ""
    assert failed == "the run failed before its first optimizer step (exit code 2)"
    j = Verdict()
    for rank in (0, 1):
        for r in no_step_log("failed" if rank else "finished", rank):
            j.feed(r, rank)
    assert j.nothing_judged() == ("the run failed before its first optimizer step (rank 1) "
                                  "(exit code 1)")

def _site(seq: int, sid: int, line: int, function: str = "train") -> Site:
    return Site(seq=seq, t=1.0, id=sid, file="/work/train.py", line=line, function=function)


def test_findings_name_their_lines_from_the_site_records() -> None:
    """Each kind resolves the site ids of its steps into ``where``, the line to change
    first: late_reset the reset, then backward and step; missed_reset the reset in the
    wrong place, the backwards, then the step; discarded_accumulation the reset;
    cross_optimizer_leak backward, then step."""
    recs: list[Any] = [
        optimizer("D"), optimizer("G", seq=2),
        _site(3, 1, 11), _site(4, 2, 12), _site(5, 3, 13), _site(6, 4, 20, "gan"),
        step(7, 0, opt="D", leaked=1, leaked_params=[1],
             sites=StepSites(step=3, leaked=[4])),
        step(8, 0, opt="G", late_params=[0], fresh=0,
             resets=[Reset(how="optimizer_zero_grad", params=[0, 1], after_backward=True,
                           site=2)],
             sites=StepSites(step=3, lost=[1])),
        step(9, 1, opt="G", discarded=3, discarded_params=[0],
             resets=[Reset(how="optimizer_zero_grad", discarded=3, site=2),
                     Reset(how="module_zero_grad", site=99)],
             sites=StepSites(lost=[1])),
        step(10, 2, opt="G", stale=2, stale_params=[0],
             sites=StepSites(step=3, stale=[1], reset=2)),
        step(11, 3, opt="G", stale=2, stale_params=[0], sites=StepSites(step=3, stale=[1])),
    ]
    found = {f.kind: [(w.role, w.line, w.function) for w in f.where]
             for f in verdict_of(recs).findings()}
    assert found == {
        "cross_optimizer_leak": [("backward", 20, "gan"), ("step", 13, "train")],
        "late_reset": [("reset", 12, "train"), ("backward", 11, "train"),
                       ("step", 13, "train")],
        "discarded_accumulation": [("reset", 12, "train")],
        # the reset in the wrong place first, then the backward, then the step; once each
        "missed_reset": [("reset", 12, "train"), ("backward", 11, "train"),
                         ("step", 13, "train")],
    }


def test_where_is_per_rank_and_empty_without_sites() -> None:
    j = Verdict()
    j.feed(optimizer(), 0)
    j.feed(optimizer(), 1)
    j.feed(_site(2, 1, 40), 1)  # rank 1's site 1: not rank 0's
    j.feed(step(3, 1, stale=1, stale_params=[0], sites=StepSites(step=1)), 0)
    j.feed(step(3, 1, stale=1, stale_params=[0], sites=StepSites(step=1)), 1)
    j.feed(step(4, 2, stale=1, stale_params=[0]), 1)  # a log from before sites
    by_rank = {f.rank: f.where for f in j.findings()}
    assert by_rank[0] == []
    assert [(w.role, w.line) for w in by_rank[1]] == [("step", 40)]
