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
from typing import Any

from gradwatch.wire import OptimizerInfo, Step

SHARDED = "s"
"""The placement kind whose norms add up across ranks (``OptimizerInfo.placements``)."""


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

    def feed(self, record: Any, rank: int) -> None:
        if isinstance(record, OptimizerInfo):
            if record.placements:
                self._kinds[(rank, record.opt)] = record.placements
        elif isinstance(record, Step) and record.param_norms is not None:
            kinds = self._kinds.get((rank, record.opt))
            if kinds is not None:
                self._add(record, rank, kinds)

    def _add(self, s: Step, rank: int, kinds: str) -> None:
        key = (s.opt, s.step)
        parts = self._open.get(key)
        if parts is None:
            parts = self._open[key] = _Parts()
        if rank in parts.ranks:
            return
        parts.ranks.add(rank)
        fresh = s.param_fresh_norms
        once = not parts.once
        parts.once = True
        for k, n in enumerate(s.param_norms or ()):
            sharded = k < len(kinds) and kinds[k] == SHARDED
            if not (sharded or once):
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
            self._combined(s.opt, s.step, parts)

    def _combined(self, opt: str, step: int, p: _Parts) -> None:
        norm = math.sqrt(p.sq)
        fresh = math.sqrt(p.fresh_sq) if p.fresh_known else None
        drift = norm / fresh if fresh else None
        self.steps += 1
        if drift is not None and drift == drift:
            self.max_drift = drift if self.max_drift is None else max(self.max_drift, drift)
        self.last = {"opt": opt, "step": step, "norm": norm, "fresh_norm": fresh,
                     "drift": drift}

    def summary(self) -> dict[str, Any]:
        """``check --json``'s ``model_norms``: ``ranks``, ``steps`` combined, ``max_drift``
        and ``last`` (the latest step combined)."""
        return {"ranks": self.world, "steps": self.steps, "max_drift": self.max_drift,
                "last": self.last}
