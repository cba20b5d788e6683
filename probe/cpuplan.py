"""CPU gradient norms with less dispatch and no allocation per step: :class:`CpuPlan`.

Thread: training (the step pre-hook, through a ledger's norm schedule).
"""

from __future__ import annotations

from array import array
from operator import attrgetter
from typing import Any

import torch

_is_cpu = attrgetter("is_cpu")
_vector_norm = torch.linalg.vector_norm
_SLOT_DTYPES = {torch.float32: "f", torch.float64: "d"}
"""Dtypes a plan writes into slots, with the matching :mod:`array` type code."""
_MISFIT = (RuntimeError, ValueError)
"""What a plan's kernels raise on gradients that no longer fit it (another shape, dtype or
device, a sparse or a create_graph gradient, more or fewer of them)."""


def _require_cpu(grads: list[torch.Tensor]) -> None:
    """Refuse gradients off the CPU: there a kernel's result (or its own device check) could
    cost a sync, so no sync depends on that. (Inlined in :meth:`CpuPlan.read`.)"""
    if not all(map(_is_cpu, grads)):
        raise RuntimeError("gradients left the CPU")


class CpuPlan:
    """The norms ``torch._foreach_norm`` gives, bit for bit, for one set of CPU gradients.

    Made once for an optimizer's gradients; it answers as long as they keep their shapes,
    dtypes and device, and retires for good (:attr:`failed`, ``None`` answers) when they
    stop fitting, before any kernel that could sync. Three ways, chosen at planning:

    - *slots*: no groups, all float32 or all float64 (the usual model): each norm is written
      by ``linalg.vector_norm`` (the kernel ``_foreach_norm`` runs per tensor on CPU) into a
      slot of one buffer that is the memory of a Python :class:`array.array`.
    - *groups*: four or more small gradients of one shape and dtype are copied a chunk at a
      time into a buffer the plan keeps and reduced one chunk per kernel.
    - the rest keeps ``_foreach_norm``.

    On GPU ``_foreach_norm`` is already one fused kernel, so no plan is made.
    """

    # Slots: no ``stack`` of the norms, and the host reads them with CPython's own
    # ``memoryview.tolist``: right after a backward, a torch call's code paths are cold.
    # Groups: one kernel per tensor is mostly dispatch for small tensors, and a fresh stack
    # of a whole group each step hands blocks back to the system (page faults next step).
    _SMALL = 1 << 16
    _MIN_GROUP = 4
    _CHUNK = 1 << 20
    """Bytes of gradients copied and reduced at a time, per group (cache-sized)."""

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
        """Slots only: the buffer the norms are written into, one slot (a view) per
        gradient; its memory is :attr:`host`'s."""
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
        """A plan for ``grads``, or None when they are not all dense CPU tensors."""
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
        """:meth:`norms` as host floats (a plan with slots reads their host array, no copy);
        None, and the plan retired, as :meth:`norms`.

        Norms of gradients that require grad (``create_graph``) build a graph, freed here
        with them; a plan with slots retires on them (``out=`` refuses them), so the caller
        takes the generic way with grad mode off.
        """
        if (host := self.host) is not None:
            # :meth:`_into_slots` and :func:`_require_cpu`, inlined: the usual model's step
            # reads its norms here, with no frame beyond this one (change all three alike)
            try:
                if not all(map(_is_cpu, grads)):
                    raise RuntimeError("gradients left the CPU")
                for g, slot in zip(grads, self.slots, strict=True):
                    _vector_norm(g, out=slot)
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
        # (inlined in :meth:`read`: change both)
        _require_cpu(grads)
        for g, slot in zip(grads, self.slots, strict=True):
            _vector_norm(g, out=slot)

    def _grouped(self, grads: list[torch.Tensor]) -> torch.Tensor:
        pieces = []
        at = grads.__getitem__
        for ks, (buf, res) in zip(self.groups, self.buffers, strict=True):
            n = buf.shape[0]  # (``len`` of a tensor and a comprehension are Python frames)
            shape, dtype = buf.shape[1:], buf.dtype
            for i in range(0, len(ks), n):
                part = list(map(at, ks[i:i + n]))
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
