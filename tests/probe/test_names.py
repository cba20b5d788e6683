"""Parameter names: found in memory for ``gradwatch run`` (no model handed to the probe), and
for parameters nothing names."""

from __future__ import annotations

import weakref
from pathlib import Path

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
