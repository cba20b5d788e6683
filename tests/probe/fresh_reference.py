"""A slow, obvious reference for fresh norms and drift: copies of every ``.grad`` before and
after each backward, norms by a plain ``torch.linalg.vector_norm`` loop.

Definition checked: the fresh part of a gradient is what the backwards since the last step
added (after minus before, summed over the backwards); drift is measured when the last
backward returned, ``|accumulated| / |fresh|``; what a step reads may have been rescaled in
place since, so each parameter's fresh norm at the step is the norm it read times
``|fresh_k| / |accumulated_k|`` at that backward's end, the step's fresh norm is the norm of
those, and the step's drift ``norm / fresh_norm``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch


def _norm(t: torch.Tensor | None) -> float:
    return 0.0 if t is None else float(torch.linalg.vector_norm(t.detach().double()))


@dataclass
class Row:
    norm: float
    fresh_norm: float
    drift: float
    param_fresh: list[float]
    at_backward: float
    """``|accumulated| / |fresh|`` over every parameter, when the last backward returned."""


class FreshReference:
    """Run ``backward`` through :meth:`backward`, call :meth:`read` where the optimizer reads
    the gradients, and :meth:`reset` where the loop resets them."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.params = params
        self.fresh: list[torch.Tensor | None] = [None] * len(params)
        self.acc: list[float] = [0.0] * len(params)
        self.fresh_at: list[float] = [0.0] * len(params)
        self.rows: list[Row] = []

    def _grads(self) -> list[torch.Tensor | None]:
        return [None if p.grad is None else p.grad.detach().clone() for p in self.params]

    def backward(self, loss: torch.Tensor, **kw: Any) -> None:
        before = self._grads()
        loss.backward(**kw)
        after = self._grads()
        for k, (b, a) in enumerate(zip(before, after, strict=True)):
            if a is None:
                continue
            d = a if b is None else a - b
            f = self.fresh[k]
            self.fresh[k] = d if (f is None or b is None) else f + d
        self.acc = [_norm(a) for a in after]
        self.fresh_at = [_norm(f) for f in self.fresh]

    def reset(self) -> None:
        self.fresh = [None] * len(self.params)

    def read(self) -> Row:
        """The step reads the gradients now."""
        norms = [_norm(p.grad) for p in self.params]
        fresh = [n * f / a if a > 0 else 0.0
                 for n, f, a in zip(norms, self.fresh_at, self.acc, strict=True)]
        total, fresh_total = math.hypot(*norms), math.hypot(*fresh)
        at = math.hypot(*self.acc) / math.hypot(*self.fresh_at)
        row = Row(total, fresh_total, total / fresh_total, fresh, at)
        self.rows.append(row)
        self.reset()
        return row
