"""Parameter names: found in memory for ``gradwatch run`` (no model handed to the probe), and
for parameters nothing names."""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Any

import torch

import gradwatch
from gradwatch.probe.names import from_live_modules, unnamed
from gradwatch.steplog import read_log
from gradwatch.wire import OptimizerInfo


class _Thing:
    pass


def test_dead_weak_proxies_in_memory_do_not_break_name_discovery() -> None:
    # Libraries keep weakref.proxy objects around; once their target is gone, any
    # attribute read on them (isinstance reads __class__) raises ReferenceError.
    thing = _Thing()
    dead = [weakref.proxy(thing)]
    del thing
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1))
    names = from_live_modules(list(model.parameters()))
    assert names[0].endswith("0.weight") and names[-1].endswith("2.bias")
    assert len(dead) == 1


def test_parameters_without_a_name_are_named_by_group_and_position(tmp_path: Path) -> None:
    """A parameter the model does not name gets ``group{g}.param{i}``: the i-th of its
    param group (``param{i}``, the i-th of all, only where the groups are unknown)."""
    model = torch.nn.Linear(3, 2)
    extra = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([{"params": list(model.parameters())}, {"params": [extra]}], lr=0.1)
    with gradwatch.watch(opt, model=model, log=tmp_path / "n.jsonl"):
        pass
    infos = [r for r in read_log(tmp_path / "n.jsonl").records if isinstance(r, OptimizerInfo)]
    assert [i.params for i in infos] == [["weight", "bias", "group1.param0"]]
    with gradwatch.watch(torch.optim.SGD([extra], lr=0.1), log=tmp_path / "p.jsonl"):
        pass
    infos = [r for r in read_log(tmp_path / "p.jsonl").records if isinstance(r, OptimizerInfo)]
    assert [i.params for i in infos] == [["group0.param0"]]
    assert unnamed(None, 2) == ["param0", "param1"]


# ------------------------------------------------------------------ gradwatch run's names
def _run_session(tmp_path: Path, body: Any) -> list[OptimizerInfo]:
    """Run ``body()`` under ``gradwatch run``'s session, as the runner does, and return the
    optimizers it announced."""
    from gradwatch.probe.autostart import AutoSession, Plan

    session = AutoSession(Plan(log=str(tmp_path / "n.jsonl"), run_name="names", run="n"))
    session.announce = False
    session.install()
    try:
        body()
    finally:
        session.close("finished", 0)
    return [r for r in read_log(tmp_path / "n.jsonl").records if isinstance(r, OptimizerInfo)]


def test_variables_name_optimizers_and_the_roots_of_their_parameters(tmp_path: Path) -> None:
    def body() -> None:
        enc = torch.nn.Sequential(torch.nn.Linear(4, 3))
        dec = torch.nn.Sequential(torch.nn.Linear(3, 4))
        enc_opt = torch.optim.SGD(enc.parameters(), lr=0.1)
        dec_opt = torch.optim.Adam(dec.parameters())
        assert enc_opt is not dec_opt

    infos = _run_session(tmp_path, body)
    assert [(i.opt, i.label, i.params) for i in infos] == [
        ("SGD#0", "enc_opt", ["enc.0.weight", "enc.0.bias"]),
        ("Adam#1", "dec_opt", ["dec.0.weight", "dec.0.bias"])]


class _Trainer:
    def __init__(self) -> None:
        self.gen = torch.nn.Sequential(torch.nn.Linear(2, 2))
        self.disc = torch.nn.Sequential(torch.nn.Linear(2, 1))
        self.g_opt = torch.optim.Adam(self.gen.parameters())
        self.opts = {}
        self.opts["d"] = torch.optim.SGD(self.disc.parameters(), lr=0.1)


class _MyOpt(torch.optim.SGD):
    def __init__(self, params: Any) -> None:
        super().__init__(params, lr=0.1)


def test_attributes_dict_entries_and_subclasses_are_named(tmp_path: Path) -> None:
    def body() -> None:
        trainer = _Trainer()
        mine = _MyOpt(trainer.gen.parameters())
        assert mine

    infos = _run_session(tmp_path, body)
    assert [(i.label, i.params[0]) for i in infos] == [
        ("g_opt", "gen.0.weight"), ("opts['d']", "disc.0.weight"), ("mine", "gen.0.weight")]


def test_a_module_found_in_memory_is_not_prefixed_because_of_unrelated_live_modules(
        tmp_path: Path) -> None:
    unrelated = [torch.nn.Linear(3, 3), torch.nn.Conv1d(1, 1, 1)]  # left alive by "earlier code"

    def body() -> None:
        hidden = [torch.nn.Linear(2, 2)]  # held only in a list: found in memory
        opt = torch.optim.SGD(hidden[0].parameters(), lr=0.1)
        assert opt

    infos = _run_session(tmp_path, body)
    assert infos[-1].params == ["weight", "bias"]
    assert unrelated


def test_no_variable_no_label_and_shared_labels_stay_unique(tmp_path: Path) -> None:
    w = torch.zeros(3, requires_grad=True)

    def body() -> None:
        # the first is built before the second: only the second is stored right after
        a, b = torch.optim.SGD([w], lr=0.1), torch.optim.SGD([w], lr=0.1)
        for _ in range(2):
            opt = torch.optim.SGD([w], lr=0.1)
        hidden = [torch.nn.Linear(2, 2)]  # held only in a list: found in memory instead
        opt = torch.optim.SGD(hidden[0].parameters(), lr=0.1)
        assert a is not b and opt

    infos = _run_session(tmp_path, body)
    assert [i.label for i in infos] == [None, "b", "opt", "opt (SGD#3)", "opt (SGD#4)"]
    assert infos[0].params == ["w"]  # a plain tensor is named by its variable too
    assert infos[-1].params == ["weight", "bias"]


# ------------------------------------------------------------------ watch()'s names
class _Loop:
    """A training loop object holding its optimizer as ``self.opt``."""

    def __init__(self, opt: torch.optim.Optimizer, tmp_path: Path) -> None:
        self.opt = opt
        self.path = tmp_path / "loop.jsonl"

    def watch(self) -> gradwatch.WatchHandle:
        return gradwatch.watch(self.opt, log=self.path)


def _missed(opt: torch.optim.Optimizer, w: torch.Tensor, steps: int = 3) -> None:
    for _ in range(steps):  # never reset: every step after the first re-applies old grads
        (w * w).sum().backward()
        opt.step()


def test_watch_names_the_optimizer_as_the_calling_code_holds_it(tmp_path: Path) -> None:
    """``watch(opt)`` names it ``opt`` in the header record, the finding and its fix; an
    attribute reads ``self.opt``; ``names=`` still wins."""
    w = torch.ones(3, requires_grad=True)
    adam = torch.optim.Adam([w], lr=0.1)
    with gradwatch.watch(adam, log=tmp_path / "a.jsonl") as h:
        _missed(adam, w)
    (f,) = h.findings()
    assert (f.kind, f.optimizer) == ("missed_reset", "adam")
    assert "adam.zero_grad()" in f.fix and "Adam#0" not in f.fix + f.message
    infos = [r for r in read_log(tmp_path / "a.jsonl").records if isinstance(r, OptimizerInfo)]
    assert [i.label for i in infos] == ["adam"]

    loop = _Loop(torch.optim.SGD([w], lr=0.1), tmp_path)
    with loop.watch() as h:
        _missed(loop.opt, w)
    assert [f.optimizer for f in h.findings()] == ["self.opt"]

    with gradwatch.watch(adam, log=tmp_path / "n.jsonl", names=["enc_opt"]) as h:
        _missed(adam, w)
    assert [f.optimizer for f in h.findings()] == ["enc_opt"]


def test_an_optimizer_no_variable_holds_at_watch_is_named_at_its_first_step(
        tmp_path: Path) -> None:
    w = torch.ones(3, requires_grad=True)
    made = [torch.optim.SGD([w], lr=0.1)]  # held in a list: no variable names it
    with gradwatch.watch(made[0], log=tmp_path / "s.jsonl") as h:
        _missed(made[0], w)  # _missed's frame, which steps it, holds it as ``opt``
    assert [f.optimizer for f in h.findings()] == ["opt"]
    infos = [r for r in read_log(tmp_path / "s.jsonl").records if isinstance(r, OptimizerInfo)]
    assert [i.label for i in infos] == [None, "opt"]  # announced again, named
