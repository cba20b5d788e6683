"""Lifecycle records on the wire and in the verdict (torch-free): ``untrained_params``,
``idle_optimizer``, and the virtual optimizer ``manual``."""

from __future__ import annotations

import json
from typing import Any

from gradwatch.verdict import Verdict, verdict_of
from gradwatch.wire import (
    PROTOCOL_VERSION,
    Holding,
    OptimizerInfo,
    Unowned,
    parse_record,
)
from gradwatch.wirejson import dump_record
from tests.core.logs import header, optimizer, step


def _unowned(seq: int, count: int = 2, **kw: Any) -> Unowned:
    base: dict[str, Any] = dict(params=["head.weight", "head.bias"][:count],
                                shapes=[[2, 8], [2]][:count], count=count,
                                numel=18 if count else 0, backwards=5, first_step=0, step=9)
    base.update(kw)
    return Unowned(seq=seq, t=2.0, **base)


def _holding(seq: int, opt: str = "SGD#0", **kw: Any) -> Holding:
    base: dict[str, Any] = dict(step=1, requiring=2, held=True, never=[])
    base.update(kw)
    return Holding(seq=seq, t=2.0, opt=opt, **base)


def test_new_records_round_trip_and_old_records_still_read() -> None:
    for rec in (_unowned(3), _holding(4, never=[1])):
        assert parse_record(dump_record(rec), PROTOCOL_VERSION) == rec
    # a record written before these fields existed reads with their defaults
    old = json.loads(dump_record(optimizer()))
    del old["manual"]
    assert parse_record(json.dumps(old), 1).manual is False


def test_untrained_params_left_out() -> None:
    recs = [optimizer(), step(2, 0), _unowned(3)]
    [f] = verdict_of([header(), *recs]).findings()
    assert (f.kind, f.optimizer, f.params, f.first_step, f.last_step, f.steps) == (
        "untrained_params", "(no optimizer)", ["head.weight", "head.bias"], 0, 9, 10)
    assert "18 elements" in f.message and "5 sampled backward passes" in f.message
    assert "requires_grad_(False)" in f.fix


def test_untrained_params_next_to_parameters_that_never_had_a_gradient() -> None:
    """The optimizer holds parameters of the same shapes that never had a gradient: the
    module was replaced after the optimizer was built."""
    info = OptimizerInfo(seq=1, t=1.0, opt="SGD#0", cls="SGD",
                         params=["body.weight", "head.weight", "head.bias"],
                         shapes=[[8, 4], [2, 8], [2]])
    recs = [info, _holding(2, requiring=3, never=[1, 2]), _unowned(3)]
    [f] = verdict_of(recs).findings()
    assert "SGD#0 holds 2 parameters of the same shapes" in f.message
    assert "replaced after SGD#0 was built" in f.message


def test_idle_optimizer_and_its_withdrawal() -> None:
    j = Verdict()
    j.feed(optimizer())
    for n in range(3):
        j.feed(step(2 + n, n, consumed=0, fresh=0))
    [f] = j.feed(_holding(5, step=2, held=False, never=[0, 1]))
    assert (f.kind, f.optimizer, f.first_step, f.last_step, f.steps) == (
        "idle_optimizer", "SGD#0", 0, 2, 3)
    assert f.params == ["w", "b"] and "none of its 2 parameters" in f.message
    assert j.summary()["by_kind"] == {"idle_optimizer": 1}
    assert j.feed(_holding(6, step=4, held=True)) == []  # a gradient at last: withdrawn
    assert j.findings() == []


def test_frozen_optimizer_is_not_idle() -> None:
    recs = [optimizer(), _holding(2, step=4, requiring=0, held=False)]
    assert verdict_of(recs).findings() == []


def test_manual_steps_are_counted_and_get_their_own_fix() -> None:
    info = OptimizerInfo(seq=1, t=1.0, opt="manual", cls="ManualUpdates",
                         params=["weight", "bias"], manual=True)
    recs = [info, step(2, 0, opt="manual"),
            step(3, 1, opt="manual", consumed=4, stale=2, stale_params=[0, 1])]
    j = verdict_of([header(), *recs])
    [f] = j.findings()
    assert (f.kind, f.optimizer) == ("missed_reset", "manual")
    assert "updates by hand" in f.message and "model.zero_grad()" in f.fix
    assert j.summary()["manual_steps"] == 2 and j.summary()["steps"] == 2
