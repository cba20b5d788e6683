"""Synthetic step records built with the wire models (no torch), for server tests."""

from __future__ import annotations

import math
from typing import Any

from gradwatch.server.rows import Row
from gradwatch.wire import End, Header, IngestBatch, OptimizerInfo, Reset, Step


def header(run: str = "run1", rank: int = 0, t0: float = 1000.0, world_size: int = 1,
           name: str | None = None) -> Header:
    return Header(seq=0, t=t0, run=run, run_name=name or run, rank=rank,
                  world_size=world_size, torch_version="2.13.0",
                  gradwatch_version="0.1.0", started=t0)


def step(seq: int, i: int, opt: str = "SGD#0", t0: float = 1000.0, stale_from: int | None =
         None, nparams: int = 3, nan_at: int | None = None) -> Step:
    stale = stale_from is not None and i >= stale_from
    norm = float("nan") if nan_at == i else 1.0 + 0.5 * math.sin(i / 7.0) + (
        i - stale_from if stale and stale_from is not None else 0)
    return Step(
        seq=seq, t=t0 + 0.01 * (i + 1), opt=opt, step=i, backwards=1,
        consumed=nparams * (2 if stale else 1), fresh=nparams,
        stale=nparams if stale else 0, stale_params=list(range(nparams)) if stale else [],
        resets=[] if stale else [Reset(how="optimizer_zero_grad",
                                       params=list(range(nparams)))],
        norm=norm, fresh_norm=1.0, drift=norm,
        param_norms=[norm / nparams] * nparams, param_fresh_norms=[1.0 / nparams] * nparams)


def records(run: str = "run1", steps: int = 50, rank: int = 0, stale_from: int | None = None,
            end: bool = True, opt: str = "SGD#0", nan_at: int | None = None,
            world_size: int = 1) -> list[Any]:
    """A whole stream: header, optimizer, ``steps`` steps and (optionally) End."""
    out: list[Any] = [header(run, rank, world_size=world_size),
                      OptimizerInfo(seq=1, t=1000.0, opt=opt, cls="SGD",
                                    params=["w0", "w1", "w2"], shapes=[[2, 2], [2], [1]],
                                    groups=[0, 0, 0])]
    for i in range(steps):
        out.append(step(len(out), i, opt, stale_from=stale_from, nan_at=nan_at))
    if end:
        out.append(End(seq=len(out), t=1000.0 + 0.01 * (steps + 2), status="finished",
                       steps=steps))
    return out


def batches(recs: list[Any], run: str = "run1", rank: int = 0, size: int = 20) -> list[str]:
    """Ingest frames (JSON text) of ``size`` records each."""
    return [IngestBatch(run=run, rank=rank, records=recs[i:i + size]).model_dump_json()
            for i in range(0, len(recs), size)]


def log_text(recs: list[Any]) -> str:
    return "".join(r.model_dump_json() + "\n" for r in recs)


def row_from_step(s: Step, rank: int) -> Row:
    """The row of a step record, read off its fields: what the server makes from its
    columns (``steptable.row_of``) must equal this."""
    return Row(rank, s.opt, s.step, s.t, s.norm, s.fresh_norm, s.drift, s.stale, s.leaked,
               len(s.late_params), s.discarded, s.skipped,
               tuple((r.how, len(r.params)) for r in s.resets), s.loss,
               None if s.lr is None else tuple(s.lr))
