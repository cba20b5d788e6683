"""Gradient norms in batches, once per step: on GPU one ``_foreach_norm`` and one stack; on
CPU a :class:`~gradwatch.probe.cpuplan.CpuPlan`.

On a GPU nothing here reads a value back to the host except :func:`values`, used only on
the rare suspicious path (content already consumed, no new contribution): sampled norms
stay on the device and the writer thread copies them to the host, so the training thread
never waits. On CPU, where reading costs no device sync, they are read at once (see
:class:`NormSample`).

Fresh norms (the contributions added since the previous step): where a parameter's
``.grad`` holds only fresh contributions (every clean step) the fresh norm *is* the norm,
with no extra kernel. Where it also holds contributions consumed before (a missed reset),
the exact fresh part is ``grad - grad_at_last_step``; that needs a copy of the consumed
gradient, which the probe keeps only for optimizers that have already shown stale
consumption (the bug path). Where the fresh part is not exactly known it is ``None``.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from typing import Any

import torch

from gradwatch.probe.cpuplan import CpuPlan

_grad_enabled = torch.is_grad_enabled
_set_grad_enabled = torch._C._set_grad_enabled


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
    """Norms of ``grads`` on the host (one copy for the whole list)."""
    with torch.no_grad():
        out: list[float] = _norm_list(grads).tolist()
    return out


class NormSample:
    """Norms of one step: device tensors (GPU), or host floats already (CPU).

    ``ks`` are the parameter indices that had a gradient; ``norms[j]`` and ``fresh[j]``
    belong to ``ks[j]``; positions in ``unknown`` have no exact fresh norm.

    On GPU the tensors stay on the device and the writer thread copies them, so the
    training thread never waits. On CPU (a :class:`CpuPlan`) they are read at once, which
    costs no device sync: small tensors kept alive for the writer, freed later by another
    thread, break up the heap the next steps' gradients are allocated from, and a step
    can then pay page faults for its gradients.
    """

    __slots__ = ("n_params", "ks", "norms", "fresh", "unknown")

    def __init__(self, n_params: int, ks: Sequence[int], norms: torch.Tensor | list[float],
                 fresh: torch.Tensor | list[float], unknown: list[int]) -> None:
        self.n_params = n_params
        self.ks = ks
        self.norms = norms
        self.fresh = fresh
        self.unknown = unknown

    def host(self) -> tuple[list[float | None], list[float | None], float, float | None]:
        """``(norms, fresh_norms, norm, fresh_norm)`` on the host; ``None`` where unknown."""
        nv = _listed(self.norms)
        same = self.fresh is self.norms
        fv = nv if same else _listed(self.fresh)
        total = _total(nv)
        ft = None if self.unknown else (total if same else _total(fv))
        if len(self.ks) == self.n_params and not self.unknown:
            return nv, fv, total, ft
        per: list[float | None] = [None] * self.n_params
        fresh: list[float | None] = [None] * self.n_params
        for j, k in enumerate(self.ks):
            per[k] = nv[j]
            fresh[k] = fv[j]
        for j in self.unknown:
            fresh[self.ks[j]] = None
        return per, fresh, total, ft


def on_host(sample: NormSample | list[float]
            ) -> tuple[list[float | None], list[float | None], float, float | None]:
    """``(norms, fresh_norms, norm, fresh_norm)`` of a sample on the host. A list is the
    usual CPU step's :meth:`CpuPlan.read`: every parameter, all of it fresh."""
    if isinstance(sample, list):
        total = _total(sample)
        return sample, sample, total, total  # type: ignore[return-value]
    return sample.host()


def _listed(x: torch.Tensor | list[float]) -> list[Any]:
    """Host values: read from the device (GPU), or already read (CPU)."""
    return x if isinstance(x, list) else x.tolist()


def _total(xs: list[float]) -> float:
    """Norm of all parameters together, on the host: NaN where one is NaN (as the norm of
    the whole gradient would be), else Inf where one is Inf."""
    total = math.hypot(*xs)
    if total == math.inf and any(x != x for x in xs):
        return math.nan
    return total


def sample(grads: list[torch.Tensor | None], scale: Any, zero: list[int],
           mixed: list[tuple[int, int]], baseline: list[Any] | None,
           missing: bool = True, plan: CpuPlan | None = None) -> NormSample:
    """Norms of this step's gradients and of their fresh part.

    Args:
        grads: the gradients the step read, ``None`` where a parameter has none.
        scale: GradScaler's scale when the optimizer unscales itself (fused), else None.
        zero: indices whose gradient holds no fresh contribution (fresh norm 0).
        mixed: ``(k, n_new)`` for gradients holding stale and fresh contributions.
        baseline: copies taken at the previous step (bug path), or None.
        missing: whether some entries of ``grads`` may be None.
        plan: a :class:`CpuPlan` for these gradients (CPU), or None.
    """
    enabled = _grad_enabled()
    if enabled:  # a norm of a grad that requires grad (create_graph) must not build a graph
        _set_grad_enabled(False)  # (cheaper than entering ``torch.no_grad()`` per step)
    try:
        return _sample(grads, scale, zero, mixed, baseline, missing, plan)
    finally:
        if enabled:
            _set_grad_enabled(True)


def _sample(grads: list[torch.Tensor | None], scale: Any, zero: list[int],
            mixed: list[tuple[int, int]], baseline: list[Any] | None, missing: bool,
            plan: CpuPlan | None) -> NormSample:
    if missing:
        ks = [k for k, g in enumerate(grads) if g is not None]
        present = [grads[k] for k in ks]
    else:
        ks = range(len(grads))  # type: ignore[assignment]
        present = grads
    planned = (None if missing or plan is None or plan.failed
               else plan.norms(present))  # type: ignore[arg-type]
    cpu = planned is not None
    norms = _norm_list(present) if planned is None else planned  # type: ignore[arg-type]
    if scale is not None:
        norms = norms / scale.to(norms.device)
    if not zero and not mixed:
        return _made(len(grads), ks, norms, norms, [], cpu)
    pos = {k: j for j, k in enumerate(ks)}
    fresh = norms.clone()
    if zero:
        fresh[[pos[k] for k in zero if k in pos]] = 0.0
    unknown: list[int] = []
    exact: list[tuple[int, torch.Tensor, torch.Tensor]] = []
    for k, n_new in mixed:
        g = grads[k]
        base = baseline[k] if baseline is not None else None
        if (g is None or base is None or base[1]() is not g
                or g._version != base[2] + n_new):
            if k in pos:
                unknown.append(pos[k])
        else:
            exact.append((pos[k], g, base[0]))
    if exact:
        diffs = torch._foreach_sub([e[1] for e in exact], [e[2] for e in exact])
        dn = _norm_list(list(diffs))
        if scale is not None:
            dn = dn / scale.to(dn.device)
        fresh[[e[0] for e in exact]] = dn.to(fresh.device, fresh.dtype)
    return _made(len(grads), ks, norms, fresh, unknown, cpu)


def _made(n: int, ks: Sequence[int], norms: torch.Tensor, fresh: torch.Tensor,
          unknown: list[int], cpu: bool) -> NormSample:
    """The sample; on CPU read to the host at once (see :class:`NormSample`)."""
    if not cpu:
        return NormSample(n, ks, norms, fresh, unknown)
    host = norms.tolist()
    return NormSample(n, ks, host, host if fresh is norms else fresh.tolist(), unknown)


def snapshot(grads: list[torch.Tensor | None]) -> list[Any]:
    """Copies of the consumed gradients (bug path only), with identity and version."""
    ref = weakref.ref
    with torch.no_grad():
        return [None if g is None or g.is_sparse else (g.detach().clone(), ref(g), g._version)
                for g in grads]
