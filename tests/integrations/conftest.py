"""The framework tests run offline on CPU: no hub downloads, no reporting integrations, no
telemetry, nothing written outside pytest's temporary directories."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                  HF_HUB_DISABLE_TELEMETRY="1", WANDB_DISABLED="true", WANDB_MODE="disabled",
                  TOKENIZERS_PARALLELISM="false")

from gradwatch.steplog import read_log  # noqa: E402
from gradwatch.verdict import Verdict, verdict_of  # noqa: E402


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
           tmp_path: Path) -> Iterator[None]:
    # Findings are warnings of the probe: the broken runs' tests read them from the log.
    caplog.set_level(logging.ERROR, logger="gradwatch.probe")
    monkeypatch.chdir(tmp_path)  # anything a framework writes by default lands here
    yield


def judged(path: Path) -> Verdict:
    """The verdict of a step log, read back as ``gradwatch check`` reads it."""
    log = read_log(path)
    assert not log.warnings, log.warnings
    return verdict_of([log.header, *log.records])


def kinds(v: Verdict) -> set[tuple[str, str]]:
    return {(f.kind, f.optimizer) for f in v.findings()}
