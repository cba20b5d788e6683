"""Gradient norms, batched once per step, and when each optimizer samples them.

Thread: training (the step pre-hook, through a ledger).

Nothing here reads a device value back to the host except :func:`values` (the rare
suspicious path): on a GPU sampled norms stay on the device and the writer thread copies
them, so the training thread never waits. On CPU, where reading costs no sync, they are read
at once (see :func:`_made`).

Fresh norms (the contributions added since the previous step): where a ``.grad`` holds only
fresh contributions (every clean step) the fresh norm *is* the norm, with no extra kernel.
Where it also holds contributions consumed before (a missed reset), the fresh part is
measured around each backward of an armed optimizer (:mod:`gradwatch.probe.freshpart`), so
that an in-place rescale before the step leaves the drift as it was. Where the fresh part
was not measured it is ``None``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from gradwatch.probe.cpuplan import CpuPlan
from gradwatch.probe.facts import Norms, NormSample
from gradwatch.probe.freshpart import FreshPart
from gradwatch.probe.shards import GradReader, local

_grad_enabled = torch.is_grad_enabled
_set_grad_enabled = torch._C._set_grad_enabled

Grads = list[torch.Tensor | None]
"""The gradients a step reads, one per parameter (None where a parameter has none)."""


class NormSchedule:
    """When one optimizer's norms are sampled, and how: its :class:`CpuPlan` and, on the bug
    path, the fresh part its gradients hold (:class:`FreshPart`). Owned by its ledger."""

    __slots__ = ("opt", "every", "plan", "planned", "fresh", "stale_seen", "quiet",
                 "measuring", "began")

    def __init__(self, opt: torch.optim.Optimizer, every: int, reader: GradReader) -> None:
        self.opt = opt
        self.every = every
        """Sample every N steps (0 = never)."""
        self.plan: CpuPlan | None = None
        self.planned = False
        """:attr:`plan` was made (it is None where the gradients are not all on the CPU)."""
        self.fresh = FreshPart(reader)
        self.stale_seen = False
        """The optimizer consumed stale content once."""
        self.quiet = False
        """Resets follow this optimizer's armed backwards (written by hand, ``p.grad =
        None`` or ``p.grad.zero_()``, or a zero_grad that threw a measured backward away):
        its fresh part is not measured unless it re-applies old gradients."""
        self.measuring = False
        """A backward is being measured (:meth:`backward_begins`)."""
        self.began = False
        """A fresh part was measured since it was last cleared: only then can
        :attr:`fresh` hold one (the usual step and reset skip asking it)."""

    def due(self, step: int, grads: Grads, zero: list[int],
            mixed: list[tuple[int, int]], missing: bool) -> Norms:
        """This step's norms when due, else None (see :func:`sample` for the arguments).
        The step consumes the gradients: their fresh part starts again from nothing."""
        every = self.every
        if not every:
            return None
        norms: Norms = None
        if step % every == 0:
            if not self.planned and not missing:
                self.plan = CpuPlan.make(grads)  # type: ignore[arg-type]  # no None in them
                self.planned = True
            plan = self.plan
            scale = getattr(self.opt, "grad_scale", None)
            # The usual CPU step, all fresh, read at once; groups with grad mode off, as
            # ``sample`` does (their ``out=`` buffers refuse a create_graph grad).
            if (plan is not None and scale is None
                    and not (plan.failed or missing or zero or mixed)):
                if not plan.groups:
                    norms = plan.read(grads)  # type: ignore[arg-type]  # no None in them
                else:  # (``sample``'s way for this case, without its three frames)
                    enabled = _grad_enabled()
                    if enabled:
                        _set_grad_enabled(False)
                    try:
                        got = plan.norms(grads)  # type: ignore[arg-type]  # no None
                    finally:
                        if enabled:
                            _set_grad_enabled(True)
                    norms = None if got is None else got.tolist()
            if norms is None:
                norms = sample(grads, scale, zero, mixed, self.fresh, missing, plan)
        if self.began:
            self.began = False
            self.fresh.clear()
        return norms

    def saw_stale(self) -> None:
        """The optimizer consumed stale content (measure its fresh part from now on)."""
        self.stale_seen = True

    def backward_begins(self, step: int, params: Sequence[torch.Tensor],
                        old: Sequence[int]) -> None:
        """A backward starts while the optimizer is armed (its next step is ``step``):
        measure its fresh part when that step samples norms. Not on an optimizer whose
        gradients are reset by hand and never re-applied (``p.grad.zero_()`` after each
        step arms it, and would cost a copy per backward)."""
        every = self.every
        if every and step % every == 0 and (self.stale_seen or not self.quiet):
            self.fresh.begin(params, old)
            self.measuring = self.began = True

    def reset(self) -> None:
        """Every gradient was reset: a fresh part measured since is thrown away with them."""
        if self.began and self.fresh.holding():
            self.quiet = True
            self.began = False
            self.fresh.clear()

    def backward_ends(self, params: Sequence[torch.Tensor]) -> None:
        """The engine returned from a backward :meth:`backward_begins` measures."""
        if self.measuring:
            self.measuring = False
            self.fresh.end(params)

    def skipped(self, step: int, grads: Grads) -> Norms:
        """The norms of a step GradScaler skipped, when due (as they are: nothing unscaled)."""
        every = self.every
        if every and step % every == 0:
            return sample(grads, None, [], [], None)
        return None

    def replan(self) -> None:
        """Parameters were added: plan again."""
        self.plan, self.planned = None, False


def _norm_list(grads: list[torch.Tensor]) -> torch.Tensor:
    """Norms of ``grads`` as one 1-D float tensor (dense grads batched, sparse one by one)."""
    if not grads:
        return torch.zeros(0)
    try:
        ns = list(torch._foreach_norm(grads))
    except (NotImplementedError, RuntimeError):  # sparse gradients among them
        dense = [g for g in grads if not g.is_sparse]
        dn = iter(torch._foreach_norm(dense)) if dense else iter(())
        ns = [torch.linalg.vector_norm(g.coalesce().values()) if g.is_sparse else next(dn)
              for g in grads]
    try:
        return torch.stack(ns)
    except RuntimeError:  # several devices or dtypes: gather on the host
        return torch.stack([n.detach().float().cpu() for n in ns])


def values(grads: list[torch.Tensor]) -> list[float]:
    """Norms of ``grads`` on the host (one copy for the whole list); a DTensor's are its
    local shard's."""
    return local_values([local(g) for g in grads])


def local_values(tensors: list[torch.Tensor]) -> list[float]:
    """:func:`values` of tensors that are local already (no DTensor among them)."""
    with torch.no_grad():
        out: list[float] = _norm_list(tensors).tolist()
    return out


def sample(grads: Grads, scale: Any, zero: list[int],
           mixed: list[tuple[int, int]], fresh: FreshPart | None,
           missing: bool = True, plan: CpuPlan | None = None) -> NormSample:
    """Norms of this step's gradients and of their fresh part.

    Args:
        grads: the gradients the step read, ``None`` where a parameter has none.
        scale: GradScaler's scale when the optimizer unscales itself (fused), else None.
        zero: indices whose gradient holds no fresh contribution (fresh norm 0).
        mixed: ``(k, n_new)`` for gradients holding stale and fresh contributions.
        fresh: their fresh part as measured at the backwards (bug path), or None.
        missing: whether some entries of ``grads`` may be None.
        plan: a :class:`CpuPlan` for these gradients (CPU), or None.
    """
    # (NormSchedule.due switches grad mode so too, inline, for the usual grouped CPU plan)
    enabled = _grad_enabled()
    if enabled:  # a norm of a grad that requires grad (create_graph) must not build a graph
        _set_grad_enabled(False)  # (cheaper than entering ``torch.no_grad()`` per step)
    try:
        return _sample(grads, scale, zero, mixed, fresh, missing, plan)
    finally:
        if enabled:
            _set_grad_enabled(True)


def _sample(grads: Grads, scale: Any, zero: list[int],
            mixed: list[tuple[int, int]], part: FreshPart | None, missing: bool,
            plan: CpuPlan | None) -> NormSample:
    present: list[torch.Tensor]
    ks: Sequence[int]
    if missing:
        ks = [k for k, g in enumerate(grads) if g is not None]
        present = [g for g in grads if g is not None]
    else:
        ks = range(len(grads))
        present = grads  # type: ignore[assignment]  # no None among them
    planned = None if missing or plan is None or plan.failed else plan.norms(present)
    cpu = planned is not None
    norms = _norm_list(present) if planned is None else planned
    if scale is not None:
        norms = norms / scale.to(norms.device)
    if not zero and not mixed:
        return _made(len(grads), ks, norms, norms, [], cpu)
    pos = {k: j for j, k in enumerate(ks)}
    fresh = norms.clone()
    if zero:
        fresh[[pos[k] for k in zero if k in pos]] = 0.0
    mixed_ks = [k for k, _ in mixed if k in pos]
    js: list[int] = []
    if part is not None and mixed_ks:
        at = [pos[k] for k in mixed_ks]
        js, scaled = part.scaled(mixed_ks, grads, norms[at])
        if scaled is not None:
            fresh[[at[j] for j in js]] = scaled
    answered = set(js)
    unknown = [pos[k] for j, k in enumerate(mixed_ks) if j not in answered]
    return _made(len(grads), ks, norms, fresh, unknown, cpu)


def _made(n: int, ks: Sequence[int], norms: torch.Tensor, fresh: torch.Tensor,
          unknown: list[int], cpu: bool) -> NormSample:
    """The sample; on CPU read to the host at once."""
    # Small CPU tensors kept alive for the writer and freed by another thread break up the
    # heap the next gradients are allocated from (page faults in the next steps).
    if not cpu:
        return NormSample(n, ks, norms, fresh, unknown)
    host = norms.tolist()
    return NormSample(n, ks, host, host if fresh is norms else fresh.tolist(), unknown)

