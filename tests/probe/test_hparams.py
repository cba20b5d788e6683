"""The run's configuration in its step log: each param group's settings in the optimizer
record (``OptimizerInfo.hparams``), the command line in the header, and old logs without
them still read."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import gradwatch
from gradwatch.steplog import read_log
from gradwatch.wire import OptimizerInfo, parse_record


def _infos(path: Path) -> list[OptimizerInfo]:
    return [r for r in read_log(path).records if isinstance(r, OptimizerInfo)]


def test_each_param_group_s_settings_and_the_command_line_are_in_the_log(
        tmp_path: Path) -> None:
    body, head = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
    sgd = torch.optim.SGD([{"params": body.parameters()},
                           {"params": head.parameters(), "lr": 0.5, "weight_decay": 0.0}],
                          lr=0.1, momentum=0.9, weight_decay=1e-4, nesterov=True)
    adam = torch.optim.AdamW(head.parameters(), lr=torch.tensor(3e-4), betas=(0.8, 0.95))
    log = tmp_path / "cfg.jsonl"
    with gradwatch.watch([sgd, adam], log=log):
        pass
    sgd_info, adam_info = _infos(log)
    g0, g1 = sgd_info.hparams
    assert (g0["lr"], g0["momentum"], g0["weight_decay"], g0["nesterov"]) == (0.1, 0.9, 1e-4, True)
    assert (g1["lr"], g1["weight_decay"], g1["momentum"]) == (0.5, 0.0, 0.9)
    (a0,) = adam_info.hparams
    assert a0["betas"] == [0.8, 0.95] and abs(a0["lr"] - 3e-4) < 1e-10  # a float32 tensor
    assert a0["weight_decay"] == 0.01 and "params" not in a0  # AdamW's default
    assert read_log(log).header.argv == [str(a) for a in sys.argv]


def test_an_optimizer_record_from_before_hparams_reads_with_none() -> None:
    line = ('{"type":"optimizer","seq":1,"t":1.0,"opt":"SGD#0","cls":"SGD",'
            '"params":["w"],"shapes":[[2]],"groups":[0]}')
    for v in (1, 2, 3):
        assert parse_record(line, v).hparams == []
