"""Gradient norms in batches, once per step: on GPU one ``_foreach_norm`` and one stack; on
CPU a :class:`CpuPlan`.

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
from array import array
from collections.abc import Sequence
from operator import attrgetter
from typing import Any

import torch

_grad_enabled = torch.is_grad_enabled
_set_grad_enabled = torch._C._set_grad_enabled
_is_cpu = attrgetter("is_cpu")
_vector_norm = torch.linalg.vector_norm
_SLOT_DTYPES = {torch.float32: "f", torch.float64: "d"}
"""Dtypes a plan writes into slots, with the matching :mod:`array` type code."""
_MISFIT = (RuntimeError, ValueError)
"""What a plan's kernels raise on gradients that no longer fit it (another shape, dtype or
device, a sparse or a create_graph gradient, more or fewer of them)."""


def _require_cpu(grads: list[torch.Tensor]) -> None:
    """A plan reads CPU gradients only: on another device a kernel's result (or its own
    device check) could cost a sync, so a sync never depends on that."""
    if not all(map(_is_cpu, grads)):
        raise RuntimeError("gradients left the CPU")


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


class CpuPlan:
    """CPU only: the same norms as ``_foreach_norm``, with less dispatch and no allocation.

    - Many small same-shaped gradients: on CPU ``_foreach_norm`` runs one kernel per
      tensor, whose dispatch dominates for small tensors (400 tensors of 64x64: ~1 ms).
      Each group of equal shapes is instead copied, a chunk at a time, into a buffer the
      plan keeps (:data:`_CHUNK` bytes, so it stays in the core's cache) and reduced one
      chunk per kernel. A fresh stack of the whole group each step would allocate and free
      a copy of it (3.2 MB there), and the allocator hands blocks that size back to the
      system: the next forward and backward then pay page faults for their own tensors.
      Large tensors keep ``_foreach_norm``.
    - No groups, all gradients float32 or all float64 (the usual model): each norm is
      written by ``linalg.vector_norm`` (the kernel ``_foreach_norm`` runs per tensor on
      CPU, so the same values, Inf and NaN included) into a slot of one buffer the plan
      keeps, with no ``stack`` (on small models the stack costs a visible share of the
      read: ``bench/probe_overhead.py`` prints both ways, timed right after the backward).
      That buffer is the memory of a Python :class:`array.array` (``torch.frombuffer``),
      so the values are read by CPython's own ``memoryview.tolist`` instead of a torch
      call: right after a backward, whose kernels have evicted torch's code paths from
      the core's caches, ``Tensor.tolist`` cost a few percent of the norm kernels on the
      MLP of the benchmark.
      A gradient that left the CPU retires the plan before any kernel runs (no sync); the
      ``out=`` slots refuse one of another dtype, and one that requires grad
      (``create_graph``): the plan retires then too.
      Other dtypes keep ``_foreach_norm``.

    On GPU ``_foreach_norm`` is already one fused kernel and the stacked result is copied
    to the host once, so no plan is made.
    """

    _SMALL = 1 << 16
    _MIN_GROUP = 4
    _CHUNK = 1 << 20
    """Bytes of gradients copied and reduced at a time, per group."""

    def __init__(self, grads: list[torch.Tensor]) -> None:
        groups: dict[tuple[Any, ...], list[int]] = {}
        for k, g in enumerate(grads):
            if g.numel() <= self._SMALL and g.is_floating_point():
                groups.setdefault((tuple(g.shape), g.dtype), []).append(k)
        self.groups = [ks for ks in groups.values() if len(ks) >= self._MIN_GROUP]
        self.buffers: list[tuple[torch.Tensor, torch.Tensor]] = []
        """Per group: the chunk buffer ``(n, *shape)`` and the group's norms."""
        for ks in self.groups:
            g = grads[ks[0]]
            n = max(1, min(len(ks), self._CHUNK // max(1, g.numel() * g.element_size())))
            self.buffers.append((torch.empty((n, *g.shape), dtype=g.dtype),
                                 torch.empty(len(ks), dtype=g.dtype)))
        grouped = {k for ks in self.groups for k in ks}
        self.rest = [k for k in range(len(grads)) if k not in grouped]
        order = [k for ks in self.groups for k in ks] + self.rest
        inverse = [0] * len(order)
        for j, k in enumerate(order):
            inverse[k] = j
        self.inverse = torch.tensor(inverse, dtype=torch.long)
        self.out: torch.Tensor | None = None
        """No groups and one dtype, float32 or float64: the buffer the norms are written
        into, one slot (a view) per gradient; its memory is :attr:`host`'s."""
        self.slots: tuple[torch.Tensor, ...] = ()
        self.host: memoryview | None = None
        """:attr:`out`'s memory as the host reads it."""
        dtypes = {g.dtype for g in grads}
        if not self.groups and len(dtypes) == 1 and (dtype := dtypes.pop()) in _SLOT_DTYPES:
            mem = array(_SLOT_DTYPES[dtype], [0.0]) * len(grads)
            self.out = torch.frombuffer(mem, dtype=dtype)  # shares (and pins) mem
            self.slots = self.out.unbind()
            self.host = memoryview(mem)
        self.failed = False
        """Set once the gradients stopped fitting the plan; the generic way is used after."""

    @classmethod
    def make(cls, grads: list[torch.Tensor]) -> CpuPlan | None:
        if not grads or any(g.is_sparse or g.device.type != "cpu" for g in grads):
            return None
        return cls(grads)

    def norms(self, grads: list[torch.Tensor]) -> torch.Tensor | None:
        """The norms, in ``grads`` order, as one CPU tensor; None, and the plan retired for
        good, where it no longer fits (shapes or dtypes changed, a gradient turned sparse,
        or the model moved off the CPU: reading there would sync)."""
        try:
            return self._grouped(grads) if self.groups else self._flat(grads)
        except _MISFIT:
            self.failed = True
            return None

    def read(self, grads: list[torch.Tensor]) -> list[float] | None:
        """:meth:`norms` on the host: the usual CPU step reads them at once (a plan with
        slots straight from their host array, no copy; others in one copy).

        Norms of gradients that require grad (``create_graph``) do build a graph, freed with
        them right here, so no grad-mode switch is needed (it costs three calls a step);
        a plan with slots retires on them instead (``out=`` refuses them) and the caller
        takes the generic way, grad mode off.
        """
        if (host := self.host) is not None:
            try:
                self._into_slots(grads)
            except _MISFIT:
                self.failed = True
                return None
            return host.tolist()  # type: ignore[return-value]  # floats: 'f' or 'd'
        norms = self.norms(grads)
        return None if norms is None else norms.tolist()

    def _flat(self, grads: list[torch.Tensor]) -> torch.Tensor:
        if self.out is not None:
            self._into_slots(grads)
            return self.out.clone()  # the buffer is written again next step
        _require_cpu(grads)
        return torch.stack(torch._foreach_norm(grads))

    def _into_slots(self, grads: list[torch.Tensor]) -> None:
        _require_cpu(grads)
        for g, slot in zip(grads, self.slots, strict=True):
            _vector_norm(g, out=slot)

    def _grouped(self, grads: list[torch.Tensor]) -> torch.Tensor:
        pieces = []
        for ks, (buf, res) in zip(self.groups, self.buffers, strict=True):
            n = len(buf)
            shape, dtype = buf.shape[1:], buf.dtype
            for i in range(0, len(ks), n):
                part = [grads[k] for k in ks[i:i + n]]
                # ``out=`` would resize rather than fail, or copy across devices (a sync),
                # so the first is checked here (stack fails on the others if their shape or
                # device differs from it); another float dtype among the others is read at
                # the buffer's precision.
                g = part[0]
                if g.shape != shape or g.dtype != dtype or not g.is_cpu:
                    raise RuntimeError("gradients changed shape or left the CPU")
                m = len(part)
                chunk = torch.stack(part, out=buf if m == n else buf[:m])
                _vector_norm(chunk.view(m, -1), dim=1, out=res[i:i + m])
            pieces.append(res)
        if self.rest:
            pieces.append(torch.stack(list(torch._foreach_norm([grads[k] for k in self.rest]))))
        out = torch.cat(pieces)[self.inverse]  # a copy: the buffers are reused next step
        if not out.is_cpu:
            raise RuntimeError("gradients left the CPU")
        return out


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
