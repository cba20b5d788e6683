"""A two-rank sharded run built with the wire models (no torch), and the model's norms the
slow obvious way: each parameter's whole gradient is made first, each rank records the norm
of its piece (rows or columns for a ``Shard`` placement, all of it for ``Replicate``), and
the reference norm is the square root of the sum of every element of every whole gradient.

Optimizers: ``AdamW#0`` (FSDP2-like: every parameter sharded, ``"ss"``), ``SGD#1`` (tensor
parallel: a column-sharded, a row-sharded and a replicated parameter, ``"ssr"``) and
``Adam#2`` (not sharded: its rows are each rank's own in every view). Rank 1 never sends
``AdamW#0``'s last step; from step 8 rank 1's ``SGD#1`` steps are stale.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

from gradwatch.wire import End, Header, OptimizerInfo, Reset, Step

RUN = "shard1"
WORLD = 2
STEPS = 12
Matrix = list[list[float]]


@dataclass
class Param:
    name: str
    rows: int
    cols: int
    kind: str
    """``rows``/``cols``: sharded along that dimension; ``rep``: replicated."""

    def piece(self, g: Matrix, rank: int) -> Matrix:
        if self.kind == "rows":
            n = self.rows // WORLD
            return g[rank * n:(rank + 1) * n]
        if self.kind == "cols":
            n = self.cols // WORLD
            return [row[rank * n:(rank + 1) * n] for row in g]
        return g


OPTIMIZERS: dict[str, list[Param]] = {
    "AdamW#0": [Param("0.weight", 4, 3, "rows"), Param("0.bias", 4, 1, "rows")],
    "SGD#1": [Param("1.weight", 4, 2, "rows"), Param("2.weight", 2, 4, "cols"),
              Param("2.bias", 2, 1, "rep")],
    "Adam#2": [Param("3.weight", 2, 2, "rep")],
}
PLACEMENTS = {"AdamW#0": "ss", "SGD#1": "ssr", "Adam#2": None}


def _norm(ms: list[Matrix]) -> float:
    return math.sqrt(sum(x * x for m in ms for row in m for x in row))


@dataclass
class ShardedRun:
    """Every rank's records, and per (opt, step) the model's norm, fresh norm and drift
    (the reference) and per (rank, opt, step) the rank's own."""

    records: dict[int, list[Any]] = field(default_factory=dict)
    model: dict[tuple[str, int], tuple[float, float, float]] = field(default_factory=dict)
    own: dict[tuple[int, str, int], tuple[float, float, float]] = field(default_factory=dict)


def sharded_run(seed: int = 0) -> ShardedRun:
    rng = random.Random(seed)
    out = ShardedRun()
    recs: dict[int, list[Any]] = {}
    for rank in range(WORLD):
        recs[rank] = [Header(seq=0, t=1000.0, run=RUN, run_name=RUN, rank=rank,
                             world_size=WORLD, torch_version="2.13.0",
                             gradwatch_version="0.1.0", started=1000.0)]
        for opt, ps in OPTIMIZERS.items():
            recs[rank].append(OptimizerInfo(
                seq=len(recs[rank]), t=1000.0, opt=opt, cls=opt.split("#")[0],
                params=[p.name for p in ps], shapes=[[p.rows, p.cols] for p in ps],
                groups=[0] * len(ps), placements=PLACEMENTS[opt]))
    for i in range(STEPS):
        for opt, ps in OPTIMIZERS.items():
            whole = [[[rng.uniform(-2, 2) for _ in range(p.cols)] for _ in range(p.rows)]
                     for p in ps]
            # every other step only half of the gradient is this step's (drift 2)
            share = 1.0 if i % 2 == 0 else 0.5
            fresh = [[[x * share for x in row] for row in g] for g in whole]
            if opt == "Adam#2":  # not sharded: each rank its own values
                whole = [[[x * (1 + rank) for x in row] for row in whole[0]]
                         for rank in range(WORLD)]
                fresh = [[[x * share for x in row] for row in g] for g in whole]
            else:
                n, f = _norm(whole), _norm(fresh)
                out.model[(opt, i)] = (n, f, n / f)
            for rank in range(WORLD):
                if opt == "AdamW#0" and rank == 1 and i == STEPS - 1:
                    continue
                if opt == "Adam#2":
                    pn, pf = [_norm([whole[rank]])], [_norm([fresh[rank]])]
                else:
                    pn = [_norm([p.piece(g, rank)]) for p, g in zip(ps, whole, strict=True)]
                    pf = [_norm([p.piece(g, rank)]) for p, g in zip(ps, fresh, strict=True)]
                norm = math.sqrt(sum(x * x for x in pn))
                fnorm = math.sqrt(sum(x * x for x in pf))
                out.own[(rank, opt, i)] = (norm, fnorm, norm / fnorm)
                stale = opt == "SGD#1" and rank == 1 and i >= 8
                r = recs[rank]
                r.append(Step(
                    seq=len(r), t=1000.0 + 0.01 * (i + 1), opt=opt, step=i, backwards=1,
                    consumed=len(ps) * (2 if stale else 1), fresh=len(ps),
                    stale=len(ps) if stale else 0,
                    stale_params=list(range(len(ps))) if stale else [],
                    resets=[] if stale else [Reset(how="optimizer_zero_grad",
                                                   params=list(range(len(ps))))],
                    norm=norm, fresh_norm=fnorm, drift=norm / fnorm,
                    param_norms=pn, param_fresh_norms=pf))
    for rank in range(WORLD):
        r = recs[rank]
        r.append(End(seq=len(r), t=1001.0, status="finished", steps=STEPS))
    out.records = recs
    return out
