"""Builders of step logs made of real wire records, for tests of the torch-free core."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gradwatch.steplog import dumps_log
from gradwatch.wire import End, Header, OptimizerInfo, Step


def header(run: str = "run1", name: str = "demo", **kw: Any) -> Header:
    return Header(seq=0, t=1.0, run=run, run_name=name, torch_version="2.13.0",
                  gradwatch_version="0.1.0", started=1.0, **kw)


def optimizer(opt: str = "SGD#0", params: tuple[str, ...] = ("w", "b"), seq: int = 1,
              label: str | None = None) -> OptimizerInfo:
    return OptimizerInfo(seq=seq, t=1.0, opt=opt, cls="SGD", params=list(params),
                         label=label)


def step(seq: int, n: int, opt: str = "SGD#0", **kw: Any) -> Step:
    base: dict[str, Any] = dict(consumed=2, fresh=2, backwards=1, norm=1.0, fresh_norm=1.0,
                                drift=1.0)
    base.update(kw)
    return Step(seq=seq, t=1.0 + n, opt=opt, step=n, **base)


def clean_log(steps: int = 5) -> list[Any]:
    recs: list[Any] = [optimizer()]
    recs += [step(2 + i, i) for i in range(steps)]
    recs.append(End(seq=2 + steps, t=99.0, steps=steps))
    return recs


def missed_reset_log() -> list[Any]:
    """Step 0 clean; steps 1-3 re-read stale gradients of both params."""
    recs: list[Any] = [optimizer(), step(2, 0)]
    for i in range(1, 4):
        recs.append(step(2 + i, i, consumed=2 * (i + 1), fresh=2, stale=2 * i,
                         stale_params=[0, 1], norm=float(i + 1), drift=float(i + 1)))
    return recs


def no_step_log(status: str | None = "finished", exit_code: int | None = 0) -> list[Any]:
    """A run that never stepped an optimizer; ``status`` None: no end record (killed)."""
    recs: list[Any] = [optimizer()]
    if status is not None:
        recs.append(End(seq=2, t=9.0, status=status, exit_code=exit_code))  # type: ignore[arg-type]
    return recs


def write(path: Path, records: list[Any], hdr: Header | None = None) -> Path:
    path.write_text(dumps_log(hdr or header(), records))
    return path
