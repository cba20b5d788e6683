"""The probe never breaks training: bad args fail early, internal errors turn it off, close()
restores every hook and wrapper."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest
import torch

import gradwatch
from gradwatch.probe.ledger import Ledger
from gradwatch.steplog import read_log
from gradwatch.streamkey import read_key
from gradwatch.wire import Stats, Step
from tests.probe.probe_helpers import loss_of, mlp


def _opt() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    m = mlp()
    return m, torch.optim.SGD(m.parameters(), lr=0.01)


@pytest.mark.parametrize("call, exc, words", [
    (lambda o, m: gradwatch.watch(m), TypeError, "torch.optim.Optimizer"),
    (lambda o, m: gradwatch.watch([]), ValueError, "at least one optimizer"),
    (lambda o, m: gradwatch.watch([o, o]), ValueError, "twice"),
    (lambda o, m: gradwatch.watch(o, model=o), TypeError, "torch.nn.Module"),
    (lambda o, m: gradwatch.watch(o, norms_every=-1), ValueError, "norms_every"),
    (lambda o, m: gradwatch.watch(o, norms_every=True), ValueError, "norms_every"),
    (lambda o, m: gradwatch.watch(o, server="localhost:1"), ValueError, "http://"),
    (lambda o, m: gradwatch.watch(o, log=123), TypeError, "file path"),
    (lambda o, m: gradwatch.watch(o, log="."), ValueError, "directory"),
    (lambda o, m: gradwatch.watch(o, names=["a", "b"]), ValueError, "one name per"),
    # caught at the call, not on the streamer thread (it crashed there) or in the writer
    (lambda o, m: gradwatch.watch(o, server="ws://127.0.0.1:99999"), ValueError, "port"),
    (lambda o, m: gradwatch.watch(o, server="http://"), ValueError, "no host"),
    (lambda o, m: gradwatch.watch(o, log=__file__ + "/run.jsonl"), ValueError,
     "is a file, not a folder"),
])
def test_bad_arguments_raise_at_once(call: Any, exc: type, words: str) -> None:
    m, opt = _opt()
    with pytest.raises(exc, match=words):
        call(opt, m)
    assert torch.optim.Optimizer.zero_grad.__name__ == "zero_grad"
    assert not hasattr(torch.optim.Optimizer.zero_grad, "__gradwatch_original__")


def test_a_log_path_that_is_a_named_pipe_is_refused_at_once(tmp_path: Path) -> None:
    # opening a pipe to write waits for a reader: the first step would hang forever
    fifo = tmp_path / "run.jsonl"
    os.mkfifo(fifo)
    _, opt = _opt()
    with pytest.raises(ValueError, match="named pipe"):
        gradwatch.watch(opt, log=fifo)


def _hook_state(m: torch.nn.Module, opt: torch.optim.Optimizer) -> tuple[Any, ...]:
    from torch.optim import optimizer as optmod
    return (
        torch.optim.Optimizer.zero_grad, torch.nn.Module.zero_grad,
        torch.amp.GradScaler.step, torch.optim.Optimizer.__init__, torch.autograd.backward,
        len(opt._optimizer_step_pre_hooks), len(opt._optimizer_step_post_hooks),
        len(optmod._global_optimizer_pre_hooks), len(optmod._global_optimizer_post_hooks),
        tuple(len(p._post_accumulate_grad_hooks or {}) for p in m.parameters()),
        type(opt).step,
    )


def test_close_restores_everything(tmp_path: Path) -> None:
    m, opt = _opt()
    before = _hook_state(m, opt)
    with gradwatch.watch(opt, log=tmp_path / "a.jsonl", model=m):
        during = _hook_state(m, opt)
        loss_of(m, 0).backward()
        opt.step()
    assert during != before
    assert _hook_state(m, opt) == before
    from gradwatch.probe.api import WatchHandle
    h = WatchHandle([], auto=True, log=tmp_path / "b.jsonl")
    assert torch.optim.Optimizer.__init__ is not before[3]
    h.close()
    h.close()  # idempotent
    assert _hook_state(m, opt) == before


def test_internal_error_turns_probe_off_training_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    m, opt = _opt()
    calls = {"n": 0}
    real = Ledger.plain_step

    def broken(*a: Any, **k: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("injected probe bug")
        return real(*a, **k)

    monkeypatch.setattr(Ledger, "plain_step", broken)
    before = _hook_state(m, opt)
    path = tmp_path / "err.jsonl"
    caplog.set_level(logging.ERROR, logger="gradwatch.probe")
    w0 = m[0].weight.detach().clone()
    with gradwatch.watch(opt, log=path) as h:
        for i in range(4):
            opt.zero_grad()
            loss_of(m, i).backward()
            opt.step()
        assert h.disabled is not None and "injected probe bug" in h.disabled
        assert _hook_state(m, opt)[5:] == before[5:]  # its hooks are already gone
    assert calls["n"] == 2
    assert not torch.equal(w0, m[0].weight)  # training went on
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "turns itself off" in errors[0].getMessage()
    recs = read_log(path).records
    assert [s.step for s in recs if isinstance(s, Step)] == [0]
    assert any(isinstance(s, Stats) and s.disabled for s in recs)
    assert _hook_state(m, opt) == before


def test_error_in_the_backward_marker_is_contained(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    m, opt = _opt()
    from gradwatch.probe.tracker import Tracker

    monkeypatch.setattr(Tracker, "begin", lambda self, *a: Tracker.fail(self, ValueError(
        "hook failure")))
    with gradwatch.watch(opt, log=tmp_path / "h.jsonl") as h:
        for i in range(3):
            opt.zero_grad()
            loss_of(m, i).backward()
            opt.step()
        assert h.disabled and "hook failure" in h.disabled
    assert all(not p._post_accumulate_grad_hooks for p in m.parameters())


def test_spool_path_and_missing_server_keeps_logging(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import sys

    monkeypatch.setenv("GRADWATCH_SPOOL_DIR", str(tmp_path / "spool"))
    monkeypatch.setitem(sys.modules, "gradwatch.stream", None)  # import fails
    m, opt = _opt()
    with gradwatch.watch(opt, server="http://127.0.0.1:9", run_id="r1") as h:
        opt.zero_grad()
        loss_of(m, 0).backward()
        opt.step()
    assert h.path == tmp_path / "spool" / "r1-rank0.jsonl"
    assert len([s for s in read_log(h.path).records if isinstance(s, Step)]) == 1
    assert any("cannot stream" in r.getMessage() for r in caplog.records)


def test_rank_suffix_and_env_run_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job/42")
    m, opt = _opt()
    with gradwatch.watch(opt, log=tmp_path / "run.jsonl") as h:
        pass
    assert h.path == tmp_path / "run.rank1.jsonl"
    hdr = read_log(h.path).header
    assert (hdr.rank, hdr.world_size, hdr.run) == (1, 2, "job-42")


def test_streamer_gets_notified(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    from gradwatch.stream import StreamStats

    events: list[str] = []
    keys: list[str | None] = []
    trust: list[bool] = []

    class FakeStreamer:
        def __init__(self, url: str, spool: Path, run: str, rank: int,
                     token: str | None = None, key: str | None = None,
                     trusted: bool = False) -> None:
            events.append(f"init {url} {Path(spool).name} {run} {rank} {token}")
            keys.append(key)
            trust.append(trusted)

        def start(self) -> None:
            events.append("start")

        def notify(self) -> None:
            events.append("notify")

        def close(self, timeout: float = 5.0) -> None:
            events.append("close")

        def stats(self) -> StreamStats:
            return StreamStats(dropped=2)

    monkeypatch.setitem(sys.modules, "gradwatch.stream",
                        types.SimpleNamespace(Streamer=FakeStreamer))
    monkeypatch.setenv("GRADWATCH_TOKEN", "tok")
    m, opt = _opt()
    with gradwatch.watch(opt, server="ws://x", log=tmp_path / "s.jsonl", run_id="rr"):
        opt.zero_grad()
        loss_of(m, 0).backward()
        opt.step()
    assert events[0] == "init ws://x s.jsonl rr 0 tok" and events[1] == "start"
    assert "notify" in events and events[-1] == "close"
    assert read_log(tmp_path / "s.jsonl").records[-1].dropped == 2
    assert keys == [read_key(tmp_path / "s.jsonl")] and keys[0]  # the log's stream key
    assert trust == [True]  # the probe's own spool: not validated again before sending


def test_full_queue_drops_and_counts(tmp_path: Path) -> None:
    import threading

    from gradwatch.probe.writer import RecordWriter
    from gradwatch.wire import Header
    from gradwatch.wirejson import dump_record

    gate = threading.Event()

    class Slow:
        """A record whose serialisation blocks the writer thread until the gate opens."""

        seq = 0

        def model_dump_json(self, **_: Any) -> str:
            gate.wait(300)  # the test opens it: a put that waited on it would hang
            return dump_record(Stats(seq=self.seq, t=0.0))

    hdr = Header(seq=0, t=0.0, run="q", run_name="q", torch_version="x",
                 gradwatch_version="x", started=0.0)
    w = RecordWriter(hdr, tmp_path / "q.jsonl", maxsize=2)
    puts = threading.Thread(target=lambda: [w.put(Slow()) for _ in range(10)])
    puts.start()
    puts.join(60)
    assert not puts.is_alive() and not gate.is_set()  # put never waited for the writer
    assert 7 <= w.dropped <= 8
    assert w.written == 1  # the header; the first record holds the writer at the gate
    gate.set()
    w.close()
    assert len(read_log(tmp_path / "q.jsonl").records) == 10 - w.dropped
    assert w.written == 1 + 10 - w.dropped


def test_records_are_numbered_in_order(tmp_path: Path) -> None:
    """``seq`` counts every line of the log from the header on, steps (built by the writer
    thread) and the other records alike: readers resume a stream from it."""
    m, opt = _opt()
    with gradwatch.watch(opt, log=tmp_path / "a.jsonl"):
        for i in range(5):
            opt.zero_grad()
            loss_of(m, i).backward()
            opt.step()
    log = read_log(tmp_path / "a.jsonl")
    kinds = {type(r).__name__ for r in log.records}
    assert {"Step", "OptimizerInfo", "End"} <= kinds
    assert [log.header.seq, *(r.seq for r in log.records)] == list(range(len(log.records) + 1))


def test_backwards_without_a_step_are_folded_not_kept_raw(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Backwards with no step nor reset between them (gradients computed for analysis)
    fold their hooks' list every so often instead of growing it without bound, and the
    step after them still counts exactly what it consumed."""
    from gradwatch.probe import tracker as probe_tracker

    monkeypatch.setattr(probe_tracker, "_MAX_HITS", 12)
    monkeypatch.setattr(probe_tracker, "_CHECK_EVERY", 4)
    m = mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    path = tmp_path / "fold.jsonl"
    with gradwatch.watch(opt, log=path) as h:
        st = h.tracker.ledgers[opt]
        longest = 0
        for i in range(40):  # 5 entries a backward: a marker and 4 parameters
            loss_of(m, i).backward()
            longest = max(longest, len(st.incoming))
        assert longest <= 12 + 4 * 5
        opt.zero_grad()
        loss_of(m, 40).backward()
        opt.step()
    steps = [r for r in read_log(path).records if isinstance(r, Step)]
    assert [(s.backwards, s.consumed, s.stale) for s in steps] == [(1, 4, 0)]


def test_run_sessions_judge_closure_steps_with_their_own_step_hooks(tmp_path: Path) -> None:
    """``gradwatch run``'s sessions hook every optimizer's steps globally, each its own: a
    closure step (LBFGS) is judged through a post-hook the session adds at its first one;
    closing one session leaves the other judging; the last restores torch."""
    from torch.optim import optimizer as optmod

    from gradwatch.probe.api import WatchHandle
    m, opt = _opt()
    before = _hook_state(m, opt)
    lbfgs = torch.optim.LBFGS(m.parameters(), lr=0.1, max_iter=3)

    def closure() -> torch.Tensor:
        lbfgs.zero_grad()
        loss = loss_of(m, 0)
        loss.backward()
        return loss

    def plain(i: int) -> None:
        opt.zero_grad()
        loss_of(m, i).backward()
        opt.step()

    a = WatchHandle([], auto=True, log=tmp_path / "a.jsonl")
    b = WatchHandle([], auto=True, log=tmp_path / "b.jsonl")
    plain(0)  # the usual step: a pre-hook per session, no post-hook
    assert len(optmod._global_optimizer_pre_hooks) == before[7] + 2
    assert len(optmod._global_optimizer_post_hooks) == before[8]
    lbfgs.step(closure)
    assert len(optmod._global_optimizer_post_hooks) == before[8] + 2
    a.close()
    lbfgs.step(closure)
    plain(1)
    b.close()
    assert _hook_state(m, opt) == before

    def steps(name: str) -> dict[str, list[Step]]:
        out: dict[str, list[Step]] = {}
        for r in read_log(tmp_path / name).records:
            if isinstance(r, Step):
                out.setdefault(r.opt, []).append(r)
        return out

    seen_a, seen_b = steps("a.jsonl"), steps("b.jsonl")
    closing_a = [s for ss in seen_a.values() for s in ss if s.closure_evals]
    closing_b = [s for ss in seen_b.values() for s in ss if s.closure_evals]
    assert len(closing_a) == 1 and len(closing_b) == 2  # each closure step judged, once
    assert all(s.closure_evals >= 1 and s.consumed == 4 * s.closure_evals
               for s in closing_a + closing_b)
    assert sum(len(ss) for ss in seen_a.values()) == 2  # plain(0) and one LBFGS step
    assert sum(len(ss) for ss in seen_b.values()) == 4
