"""Parameter names found in memory for ``gradwatch run`` (no model handed to the probe)."""

from __future__ import annotations

import weakref

import torch

from gradwatch.probe.names import from_live_modules


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
