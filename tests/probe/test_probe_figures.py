"""``WatchHandle.latest()``: each optimizer's latest written step (its norms, drift and the
run's finding count), published by the writer thread for the framework callbacks; it is one
attribute read that never waits, and ``RecordWriter.settle()`` waits for the writer."""

from __future__ import annotations

import threading
from pathlib import Path

import torch

import gradwatch
from gradwatch.steplog import read_log
from gradwatch.wire import Step
from tests.probe.probe_helpers import loss_of, mlp


def test_latest_holds_the_figures_of_each_optimizers_last_step_in_the_log(
        tmp_path: Path) -> None:
    a, b = mlp(0), mlp(1)
    opt_a = torch.optim.SGD(a.parameters(), lr=0.01)
    opt_b = torch.optim.SGD(b.parameters(), lr=0.01)
    log = tmp_path / "run.jsonl"
    with gradwatch.watch([opt_a, opt_b], names=["a", "b"], log=log) as h:
        assert h.latest() == {}
        for i in range(4):
            opt_a.zero_grad()
            if i < 2:  # b forgets its zero_grad from step 2 on
                opt_b.zero_grad()
            (loss_of(a, i) + loss_of(b, i)).backward()
            opt_a.step()
            opt_b.step()
        assert h.writer.settle()
        latest = dict(h.latest())
    last = {s.opt: s for s in read_log(log).records if isinstance(s, Step)}
    assert set(latest) == {"a", "b"}
    for name, fig in latest.items():
        s = last[name]
        assert (fig.opt, fig.step, fig.norm, fig.fresh_norm, fig.drift) == (
            s.opt, s.step, s.norm, s.fresh_norm, s.drift)
    assert latest["b"].findings == 1  # missed_reset on b, judged by the time b's step 3 was
    assert latest["b"].drift is not None and latest["b"].drift > 1.0
    assert latest["a"].drift == 1.0


def test_latest_never_waits_for_a_busy_writer(tmp_path: Path) -> None:
    m = mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    with gradwatch.watch(opt, log=tmp_path / "run.jsonl") as h:
        opt.zero_grad()
        loss_of(m, 0).backward()
        opt.step()
        assert h.writer.settle()
        before = h.latest()
        stall, stuck = threading.Event(), threading.Event()
        emit = h.writer._emit

        def slow(item: object) -> None:  # the writer thread stuck on a record
            stuck.set()
            stall.wait(300)  # the test opens it: a latest() that waited on it would hang
            emit(item)  # type: ignore[arg-type]

        h.writer._emit = slow  # type: ignore[method-assign]
        opt.zero_grad()
        loss_of(m, 1).backward()
        opt.step()
        assert stuck.wait(60)  # the writer has picked the step up and is stuck in it
        got: list[object] = []
        reader = threading.Thread(target=lambda: got.append(h.latest()))
        reader.start()
        reader.join(60)
        assert got == [before] and got[0] is before  # the last published figures, at once
        assert not stall.is_set()
        assert not h.writer.settle(timeout=0.2)  # settle() does wait, and says it timed out
        stall.set()
        assert h.writer.settle()
        assert h.latest()[before["SGD#0"].opt].step == 1
