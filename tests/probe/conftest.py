"""Helpers for probe tests: run a real tiny loop under ``gradwatch.watch`` and judge its log."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import gradwatch
from gradwatch.probe.watchargs import unwrap
from gradwatch.steplog import read_log
from gradwatch.verdict import verdict_of
from gradwatch.wire import Finding, Step


@dataclass
class Result:
    path: Path
    records: list[Any]
    findings: list[Finding]

    def steps(self, opt: str | None = None) -> list[Step]:
        return [r for r in self.records if isinstance(r, Step) and (opt is None or r.opt == opt)]

    def kinds(self) -> list[tuple[str, str, int, int]]:
        return sorted((f.kind, f.optimizer, f.first_step, f.steps) for f in self.findings)


@pytest.fixture(autouse=True)
def _quiet_probe(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    caplog.set_level(logging.WARNING, logger="gradwatch.probe")
    yield


@pytest.fixture
def watched(tmp_path: Path) -> Callable[..., Any]:
    """``watched(opts, loop, **watch_kwargs) -> Result``: run ``loop()`` under watch."""
    count = [0]

    def run(opts: Any, loop: Callable[[], None], **kw: Any) -> Result:
        count[0] += 1
        path = tmp_path / f"run{count[0]}.jsonl"
        if opts is not None and "names" not in kw:
            # the probe's tests name optimizers by their ids (``SGD#0``), as records key
            # them, not by this helper's variable: watch() would call them ``opts``
            listed = list(opts) if isinstance(opts, (list, tuple)) else [opts]
            kw["names"] = [f"{type(unwrap(o) or o).__name__}#{i}" for i, o in enumerate(listed)]
        with gradwatch.watch(opts, log=path, **kw):
            loop()
        log = read_log(path)
        assert not log.warnings
        return Result(path, log.records, verdict_of([log.header, *log.records]).findings())

    return run
