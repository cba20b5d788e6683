"""The model's gradient norms where the ranks' records meet, for parameters sharded across
ranks (FSDP2, tensor parallel): each rank records its local shard's norms
(:mod:`gradwatch.probe.shards`), and a reader combines them by each parameter's placement
(``OptimizerInfo.placements``).

A sharded parameter (``s``) holds a different piece on each rank: its norm is the square root
of the sum of the ranks' squares. Any other (``r`` replicated, ``-`` a plain tensor, which
DDP keeps equal on every rank) is the same on every rank and counted once, from the first
rank that reports it. A step is combined once every rank of the run has reported it; the
per-rank values stay in each rank's records. Imports neither torch nor fastapi.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from gradwatch.wire import OptimizerInfo, Step

SHARDED = "s"
"""The placement kind whose norms add up across ranks (``OptimizerInfo.placements``)."""


def sharded(kinds: str | None) -> bool:
    """Whether parameters of these placement kinds have norms to combine across ranks."""
    return kinds is not None and SHARDED in kinds


def all_sharded(kinds: str | None) -> bool:
    """Whether every parameter is sharded (FSDP2). A rank's step norm is the root of the
    sum of its parameters' squares, so it then combines as one sharded parameter: feed
    ``[norm]`` with the kinds ``"s"`` when the per-parameter norms are not at hand."""
    return bool(kinds) and kinds is not None and kinds.count(SHARDED) == len(kinds)


class Combined(NamedTuple):
    """The model's norms at one optimizer step, combined from every rank's."""

    opt: str
    step: int
    norm: float
    fresh_norm: float | None
    drift: float | None


class _Parts:
    __slots__ = ("sq", "fresh_sq", "ranks", "once", "fresh_known")

    def __init__(self) -> None:
        self.sq = 0.0
        self.fresh_sq = 0.0
        self.ranks: set[int] = set()
        self.once = False
        """The parameters counted once were added (by the first rank reporting)."""
        self.fresh_known = True


class ModelNorms:
    """Combines the ranks' per-parameter norms of a sharded run into the model's norm, fresh
    norm and drift per optimizer step. Feed every rank's records (any interleaving)."""

    def __init__(self, world_size: int) -> None:
        self.world = world_size
        self._kinds: dict[tuple[int, str], str] = {}
        self._open: dict[tuple[str, int], _Parts] = {}
        self.steps = 0
        """Steps combined from every rank."""
        self.max_drift: float | None = None
        self.last: dict[str, Any] | None = None
        """The latest step combined: ``opt``, ``step``, ``norm``, ``fresh_norm``, ``drift``."""

    def feed(self, record: Any, rank: int) -> Combined | None:
        """Take one record of ``rank``; the model's norms of a step it completes, if any."""
        if isinstance(record, OptimizerInfo):
            if record.placements:
                self.placements(rank, record.opt, record.placements)
        elif isinstance(record, Step) and record.param_norms is not None:
            return self.add(record.opt, record.step, rank, record.param_norms,
                            record.param_fresh_norms)
        return None

    def placements(self, rank: int, opt: str, kinds: str) -> None:
        """The placement kinds of ``opt``'s parameters on ``rank``, one character each."""
        self._kinds[(rank, opt)] = kinds

    def add(self, opt: str, step: int, rank: int, norms: Sequence[float | None],
            fresh: Sequence[float | None] | None) -> Combined | None:
        """One rank's per-parameter norms (and fresh norms) of an optimizer step; the
        model's norms once every rank has given that step's (else None). Ignored for an
        optimizer whose placements on ``rank`` are not known, and for a rank given twice."""
        kinds = self._kinds.get((rank, opt))
        if kinds is None:
            return None
        key = (opt, step)
        parts = self._open.get(key)
        if parts is None:
            parts = self._open[key] = _Parts()
        if rank in parts.ranks:
            return None
        parts.ranks.add(rank)
        once = not parts.once
        parts.once = True
        for k, n in enumerate(norms):
            shard = k < len(kinds) and kinds[k] == SHARDED
            if not (shard or once):
                continue
            f = fresh[k] if fresh is not None and k < len(fresh) else None
            if n is not None:
                parts.sq += n * n
            if f is None:
                parts.fresh_known = False
            else:
                parts.fresh_sq += f * f
        if len(parts.ranks) >= self.world:
            del self._open[key]
            return self._combined(opt, step, parts)
        return None

    def _combined(self, opt: str, step: int, p: _Parts) -> Combined:
        norm = math.sqrt(p.sq)
        fresh = math.sqrt(p.fresh_sq) if p.fresh_known else None
        drift = norm / fresh if fresh else None
        self.steps += 1
        if drift is not None and drift == drift:
            self.max_drift = drift if self.max_drift is None else max(self.max_drift, drift)
        out = Combined(opt, step, norm, fresh, drift)
        self.last = out._asdict()
        return out

    def summary(self) -> dict[str, Any]:
        """``check --json``'s ``model_norms``: ``ranks``, ``steps`` combined, ``max_drift``
        and ``last`` (the latest step combined)."""
        return {"ranks": self.world, "steps": self.steps, "max_drift": self.max_drift,
                "last": self.last}
