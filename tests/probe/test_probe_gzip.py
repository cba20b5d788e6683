"""A compressed step log from the probe: written as it trains, refused where it is streamed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import gradwatch
from gradwatch.steplog import GZIP_MAGIC, read_log
from gradwatch.wire import Step


def test_the_probe_writes_a_log_named_gz_compressed(tmp_path: Path) -> None:
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "run.jsonl.gz"
    with gradwatch.watch(opt, log=path):
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(4, 3)).sum().backward()
            opt.step()
    assert path.read_bytes()[:2] == GZIP_MAGIC
    steps = [r for r in read_log(path).records if isinstance(r, Step)]
    assert [s.step for s in steps] == [0, 1, 2] and all(s.param_norms for s in steps)


def test_a_streamed_log_must_be_plain(tmp_path: Path) -> None:
    opt = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
    with pytest.raises(ValueError, match="must be plain"):
        gradwatch.watch(opt, log=tmp_path / "run.jsonl.gz", server="ws://127.0.0.1:1")
