"""The usual steps (``Ledger.plain_step``) write exactly what the general way writes.

Each loop runs twice from the same seed: as the probe runs it, and with every step forced
through ``Ledger.consume`` + ``Ledger.finalize``. The step records (norms included, bit for
bit) and the findings must be equal, and the first run must really have taken the one-pass
way.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import gradwatch
from gradwatch.probe import records
from gradwatch.probe.backwards import _KEEP, _PRUNE_AT, _PRUNE_CHECK, Backwards
from gradwatch.probe.contributions import _MAX_PENDING, Contributions
from gradwatch.probe.facts import TextbookStep
from gradwatch.probe.ledger import Ledger
from gradwatch.probe.records import Lookup
from gradwatch.probe.writer import RecordWriter
from gradwatch.steplog import read_log
from gradwatch.verdict import verdict_of
from gradwatch.wire import Reset, Step
from gradwatch.wirejson import ObjectJson, step_text

from .probe_helpers import loss_of, mlp

Loop = Callable[[torch.nn.Module, torch.optim.Optimizer], None]


def _textbook(m: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    for i in range(6):
        opt.zero_grad()
        loss_of(m, i).backward()
        opt.step()


def _bsz_keep_zeros(m: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    for i in range(6):
        loss_of(m, i).backward()
        opt.step()
        opt.zero_grad(set_to_none=False)


def _accumulate_3(m: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    for i in range(9):
        loss_of(m, i).backward()
        if i % 3 == 2:
            opt.step()
            opt.zero_grad()


def _forgotten_after_3(m: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    for i in range(7):
        if i < 3:
            opt.zero_grad()
        loss_of(m, i).backward()
        opt.step()


def _zero_grad_once_per_epoch(m: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    for i in range(9):
        if i % 3 == 0:
            opt.zero_grad()
        loss_of(m, i).backward()
        opt.step()


def _late_reset_at_4(m: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    for i in range(6):
        opt.zero_grad()
        loss_of(m, i).backward()
        if i == 4:
            opt.zero_grad()
        opt.step()


def _reset_inside_window(m: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    for i in range(8):
        loss_of(m, i).backward()
        if i % 4 == 1:
            opt.zero_grad()
        if i % 4 == 3:
            opt.step()
            opt.zero_grad()


def _hand_set_none(m: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    for i in range(6):
        for p in m.parameters():
            p.grad = None
        loss_of(m, i).backward()
        opt.step()


LOOPS = [_textbook, _bsz_keep_zeros, _accumulate_3, _forgotten_after_3,
         _zero_grad_once_per_epoch, _late_reset_at_4, _reset_inside_window, _hand_set_none]
TAKES_ONE_PASS = {_textbook, _bsz_keep_zeros, _accumulate_3, _forgotten_after_3,
                  _zero_grad_once_per_epoch, _late_reset_at_4}
"""Loops where some steps are the usual one (a reset inside the window and hand resets
always take the general way)."""


def _run(tmp: Path, loop: Loop, norms_every: int, name: str) -> tuple[list[Any], list[Any]]:
    m = mlp(seed=3)
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    path = tmp / f"{name}.jsonl"
    with gradwatch.watch(opt, log=path, norms_every=norms_every):
        loop(m, opt)
    log = read_log(path)
    steps = [r.model_dump(exclude={"t"}) for r in log.records if isinstance(r, Step)]
    return steps, verdict_of([log.header, *log.records]).findings()


def _count_general(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Count the steps that take the general way (``consume``) from now on."""
    general = {"n": 0}
    real_consume = Ledger.consume

    def counted(*a: Any, **k: Any) -> None:
        general["n"] += 1
        real_consume(*a, **k)

    monkeypatch.setattr(Ledger, "consume", counted)
    return general


@pytest.mark.parametrize("norms_every", [1, 2, 0])
@pytest.mark.parametrize("loop", LOOPS, ids=lambda f: f.__name__.strip("_"))
def test_one_pass_step_writes_what_the_general_way_writes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, loop: Loop, norms_every: int) -> None:
    general = _count_general(monkeypatch)
    fast_steps, fast_findings = _run(tmp_path, loop, norms_every, "fast")
    took_general = general["n"]

    def always_general(ledger: Ledger) -> Any:
        ledger.consume()
        return ledger.finalize(skipped=False)

    monkeypatch.setattr(Ledger, "plain_step", always_general)
    slow_steps, slow_findings = _run(tmp_path, loop, norms_every, "general")

    assert fast_steps == slow_steps
    assert [f.model_dump() for f in fast_findings] == [f.model_dump() for f in slow_findings]
    if loop in TAKES_ONE_PASS:
        assert took_general < len(fast_steps)  # the one-pass way ran at least once


def test_probe_records_name_every_field(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer builds records unvalidated (``wire.trusted``): each must carry every field."""
    made: list[Step] = []
    real = records.step_record

    def keep(*args: Any) -> Step:
        made.append(real(*args))
        return made[-1]

    monkeypatch.setattr(records, "step_record", keep)
    for loop in LOOPS:
        _run(tmp_path, loop, 1, loop.__name__)
    assert made
    for s in made:
        assert set(s.__dict__) == set(Step.model_fields)
        assert all(set(r.__dict__) == set(Reset.model_fields) for r in s.resets)
        assert Step.model_validate(s.model_dump()) == s
        assert step_text(s) == ObjectJson.encode(s)  # the writer's copy of the encoder


def test_textbook_loop_takes_the_one_pass_way_every_step_after_the_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    general = _count_general(monkeypatch)
    handed: list[Any] = []
    real_put = RecordWriter.put

    def put(writer: RecordWriter, item: Any) -> None:
        handed.append(item)
        real_put(writer, item)

    monkeypatch.setattr(RecordWriter, "put", put)
    pulls = {"n": 0}
    real_pull = Contributions.pull

    def pull(contents: Contributions) -> None:
        pulls["n"] += 1
        real_pull(contents)

    monkeypatch.setattr(Contributions, "pull", pull)
    steps, findings = _run(tmp_path, _textbook, 1, "textbook")
    assert len(steps) == 6 and not findings
    assert general["n"] == 0
    # one backward per step: the one-pass step every time, its facts handed over as such
    assert sum(isinstance(x, TextbookStep) for x in handed) == 6
    assert pulls["n"] == 0  # it takes the hooks' list whole: no parameter lookups
    assert all(r["resets"][0]["params"] == [0, 1, 2, 3] for r in steps[1:])  # every param


def test_one_optimizer_keeps_no_first_consumers(tmp_path: Path) -> None:
    """Leaks need two optimizers: with one, no backward's first consumer is kept (nor its
    memory); a second optimizer attached later starts keeping them."""
    m = mlp(seed=3)
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    with gradwatch.watch(opt, log=tmp_path / "one.jsonl") as h:
        _textbook(m, opt)
        assert h.tracker.backwards.first_consumers == 0
        other = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
        h.tracker.attach(other)
        _textbook(m, opt)
        assert h.tracker.backwards.first_consumers == 6


def test_usual_resets_of_an_optimizer_that_never_steps_stay_bounded(tmp_path: Path) -> None:
    """The usual reset (nothing to judge, appended without ``_pend``) is kept within the
    bound ``_pend`` keeps (an optimizer reset at every step of another's loop and never
    stepped itself), and a step after them is judged as usual."""
    m = mlp(seed=3)
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    with gradwatch.watch(opt, log=tmp_path / "resets.jsonl") as h:
        pending = h.tracker.ledgers[opt].contents.pending
        for _ in range(_MAX_PENDING + 10):
            opt.zero_grad()
        assert _MAX_PENDING // 2 <= len(pending) <= _MAX_PENDING
        assert all(r.how == "optimizer_zero_grad" and not r.removed for r in pending)
        _textbook(m, opt)
    log = read_log(tmp_path / "resets.jsonl")
    assert sum(isinstance(r, Step) for r in log.records) == 6
    assert not verdict_of([log.header, *log.records]).findings()


def test_lookup_checks_its_memo_by_identity() -> None:
    """The writer's lookup of a textbook step's parameters reuses the last one only for the
    very same parameters in the same order (one-element parameters with equal values too)."""
    params = [torch.nn.Parameter(torch.zeros(1)) for _ in range(3)]
    lookup = Lookup({id(p): k for k, p in enumerate(params)})
    assert lookup.params([-1, params[2], params[1], params[0]]) == [2, 1, 0]
    assert lookup.params([-2, params[2], params[1], params[0]]) == [2, 1, 0]
    assert lookup.params([-3, params[0], params[1], params[2]]) == [0, 1, 2]
    assert lookup.params([-4, params[1]]) == [1]
    assert lookup.params([-5, 2, -6, 1]) == [-5, 2, -6, 1]  # an index list: as it is


def test_lookup_reset_params() -> None:
    """A reset's parameters, sorted, without backward markers: the textbook reset (one
    list as the hooks left it) from the memo, as a copy; any other from its parts."""
    params = [torch.nn.Parameter(torch.zeros(1)) for _ in range(3)]
    lookup = Lookup({id(p): k for k, p in enumerate(params)})
    one = [-1, params[2], params[0], params[2]]  # a reentrant backward: a parameter twice
    first = lookup.reset_params([((), [one])])
    assert first == [0, 2]
    first.append(99)  # the caller's own list
    assert lookup.reset_params([((), [[-2, params[2], params[0], params[2]]])]) == [0, 2]
    assert lookup.reset_params([((), [[-3, params[1]]])]) == [1]
    assert lookup.reset_params([((1,), [[-4, 2, 0, -5, 2]]), ((), [one])]) == [0, 1, 2]
    assert lookup.reset_params([((2,), ())]) == [2]


def test_a_long_run_of_two_optimizers_forgets_old_backwards_only() -> None:
    """Two optimizers keep each backward's first consumer and where it was called; over a
    long run the oldest are forgotten (memory stays bounded) while the recent ones still
    tell a leak and name their call site."""
    b: Backwards[object] = Backwards()
    d, g = b.join(), b.join()
    for _ in range(_PRUNE_AT + 3 * _PRUNE_CHECK):
        bw = b.begin(site=1 + (b.last + 1) % 2)  # two lines in turn: a new run each time
        assert b.claim(d, (bw,))
        b.stepped = True  # D stepped: the next backward starts a phase
    assert _KEEP <= b.first_consumers <= _PRUNE_AT + _PRUNE_CHECK
    b.begin(site=3)  # a new phase: what D consumed before leaks to G
    recent = b.last - 5
    assert b.leaked(g, [recent]) == [recent]
    assert b.site_of(recent) == 1 + recent % 2
    assert b.leaked(g, [2]) == [] and b.site_of(2) == 0  # forgotten


def test_a_step_lets_go_of_its_backwards_graph(tmp_path: Path) -> None:
    """After the usual step the probe holds nothing of the step's graph: the loss (and the
    graph's nodes) go when the loop drops them, as unwatched; a missed reset is still
    caught."""
    import gc
    import weakref

    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gone = []
    with gradwatch.watch(opt, log=tmp_path / "a.jsonl") as handle:
        for i in range(4):
            if i != 2:  # a missed reset at step 2
                opt.zero_grad()
            loss = loss_of(model, i)
            loss.backward()
            opt.step()
            graph = weakref.ref(loss)
            del loss
            gc.collect()
            gone.append(graph() is None)
        kinds = [f.kind for f in handle.findings()]
    assert gone == [True, True, False, True]  # step 2's is judged: the general way keeps it
    assert "missed_reset" in kinds
