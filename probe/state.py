"""Per-optimizer gradient bookkeeping: what each parameter's ``.grad`` holds, in contributions.

A *contribution* is one backward pass (numbered by the tracker) added into one ``.grad``.
For each parameter of a watched optimizer this keeps:

- ``old[k]``: how many contributions in ``.grad`` this optimizer already consumed;
- ``new[k]``: the backward ids of the contributions it has not consumed yet;
- ``refs[k]`` / ``vers[k]``: a weak reference to the ``.grad`` tensor and its ``_version`` at
  the last observation, to tell an accumulation (same object, version + 1) from a reset
  (another object, or an in-place change of content already consumed).

Resets append ``(how, k, removed)`` to ``pending``; the step that follows judges them.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class StepAcc:
    """Facts gathered over one step (several consumptions for closure optimizers)."""

    consumed: int = 0
    fresh: int = 0
    stale: int = 0
    leaked: int = 0
    stale_params: set[int] = field(default_factory=set)
    leaked_params: set[int] = field(default_factory=set)
    fresh_params: set[int] = field(default_factory=set)
    bws: set[int] = field(default_factory=set)
    closure_evals: int = 0
    norms: Any = None
    """``(norm_index, norms_tensor, fresh)`` from :mod:`gradwatch.probe.norms`, or None."""


class OptState:
    """Everything the probe tracks for one optimizer."""

    def __init__(self, opt: torch.optim.Optimizer, uid: int, name: str,
                 params: list[torch.Tensor], groups: list[int]) -> None:
        self.opt = opt
        self.uid = uid
        self.name = name
        self.params = params
        self.groups = groups
        n = len(params)
        self.old: list[int] = [0] * n
        self.new: list[list[int]] = [[] for _ in range(n)]
        self.refs: list[weakref.ref[torch.Tensor] | None] = [None] * n
        self.vers: list[int] = [0] * n
        self.armed = False
        """True once a step consumed and no optimizer-level zero_grad followed: hooks then
        record the grad object and version of each contribution (the rare, buggy path)."""
        self.pre_check: PreCheck | None = None
        self.unhooked: list[int] = []
        """Parameters without a hook yet (not requiring grad at attach time)."""
        self.step = 0
        self.pending: list[tuple[str, int, list[int]]] = []
        self.acc = StepAcc()
        self.in_step = False
        self.closure_step = False
        self.shown_stale = False
        self.baseline: list[tuple[torch.Tensor, Any, int] | None] | None = None
        """Bug path only: copies of the gradients consumed last step, for exact fresh norms."""
        self.custom = not type(opt).__module__.startswith("torch.optim")
        """Optimizers outside torch.optim may change ``.grad`` in place while stepping."""

    def __hash__(self) -> int:
        return id(self)

    def observe(self, grads: list[torch.Tensor | None]) -> None:
        """Remember each grad object and its version (after a consumption)."""
        ref = weakref.ref
        self.refs = [None if g is None else ref(g) for g in grads]
        self.vers = [0 if g is None else g._version for g in grads]

    def reset(self, k: int, how: str) -> None:
        """Record that parameter ``k``'s gradient content was removed by ``how``."""
        removed = self.new[k]
        if removed:
            self.new[k] = []  # hand the list itself to pending; never share it
        else:
            removed = []
        self.old[k] = 0
        self.pending.append((how, k, removed))


class PreCheck:
    """Norms of consumed gradients taken when a backward starts (armed optimizers only).

    ``p.grad.data.zero_()`` changes values without a version bump, so a contribution added
    on top of it looks like an accumulation onto consumed content. The first hook of each
    backward takes these norms (device tensors, no sync); the next drain reads them once.
    The parameter whose hook started the backward has already accumulated: it follows the
    verdict of the others.
    """

    def __init__(self, bw: int, ks: list[int], norms: torch.Tensor, trigger: int) -> None:
        self.bw = bw
        self.trigger = trigger
        self.ks = ks
        self.norms = norms
        self._vals: dict[int, float] | None = None

    @classmethod
    def take(cls, st: OptState, bw: int, trigger: int) -> PreCheck | None:
        ks, grads = [], []
        for k, p in enumerate(st.params):
            g = p.grad
            if g is not None and st.old[k] and k != trigger and not g.is_sparse:
                ks.append(k)
                grads.append(g)
        if not grads:
            return None
        with torch.no_grad():  # device tensors only: no sync inside the hook
            return cls(bw, ks, torch.stack(list(torch._foreach_norm(grads))), trigger)

    def was_zero(self, k: int, bw: int) -> bool:
        """Whether parameter ``k``'s consumed content was zeroed before backward ``bw``."""
        if bw != self.bw:
            return False
        if self._vals is None:
            self._vals = dict(zip(self.ks, self.norms.tolist(), strict=True))
        v = self._vals.get(k)
        if v is not None:
            return v == 0.0
        others = [x for j, x in self._vals.items() if j != k]
        return bool(others) and all(x == 0.0 for x in others)
