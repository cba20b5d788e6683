"""Sharded tensors (DTensor: FSDP2's ``fully_shard``, tensor parallel's
``parallelize_module``) as the probe reads them: each rank's local shard, never the whole.

Thread: training (the ledgers, the tracker and what no optimizer holds read gradients
through here).

A DTensor operation may be a collective (the norm of a sharded gradient is a partial value
that turning into a number all-reduces) and runs a sharding propagation per call; from
inside a hook, on one rank only, a collective can hang or kill the job. So the probe reads a
DTensor's ``_local_tensor`` (what ``to_local()`` returns, without autograd's wrapper) and
its norms are per rank. Where the ranks' logs meet, readers combine a parameter's norms by
its placement (:func:`placements`, recorded in ``OptimizerInfo.placements``;
:mod:`gradwatch.shardnorms`).

FSDP2 all-gathers each parameter into a plain leaf for forward and backward, then frees its
storage (``resize_(0)``): the leaf keeps its shape but holds no elements. Reading one reads
freed memory (a segfault), so nothing is read from a tensor whose storage does not hold its
elements (:func:`readable`).
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import Any

import torch

DTensor: Any
try:
    from torch.distributed.tensor import DTensor
except ImportError:  # a torch built without distributed: no DTensor can exist
    DTensor = None

Grads = list[torch.Tensor | None]


def is_dtensor(t: Any) -> bool:
    """Whether ``t`` is a DTensor (a sharded or replicated tensor of a device mesh)."""
    return DTensor is not None and isinstance(t, DTensor)


def local(t: Any) -> Any:
    """A DTensor's local shard (no collective, no autograd op); anything else as it is."""
    if DTensor is not None and isinstance(t, DTensor):
        return t._local_tensor
    return t


_grad = attrgetter("grad")


class GradReader:
    """How one optimizer's gradients are read: as they are, or, once one of its parameters
    is a DTensor, each as its local shard. Owned by the ledger, which flips :attr:`sharded`
    when parameters are added; its parts call :meth:`grads` whenever they read ``.grad``,
    so identities and versions are always those of the same tensors."""

    __slots__ = ("sharded",)

    def __init__(self, params: Sequence[torch.Tensor]) -> None:
        self.sharded = False
        self.saw(params)

    def saw(self, params: Sequence[torch.Tensor]) -> None:
        """Parameters ``params`` are read from now on."""
        if not self.sharded and DTensor is not None:
            self.sharded = any(isinstance(p, DTensor) for p in params)

    def grads(self, params: Sequence[torch.Tensor]) -> Grads:
        """The gradients of ``params`` (None where one has none)."""
        gs = list(map(_grad, params))
        if self.sharded:
            return [local(g) for g in gs]
        return gs

    def grad(self, p: torch.Tensor) -> torch.Tensor | None:
        """The gradient of one parameter."""
        g = p.grad
        return local(g) if self.sharded else g


PLAIN, SHARDED, REPLICATED = "-", "s", "r"
"""Placement kinds, one character per parameter (``OptimizerInfo.placements``): a plain
tensor, a DTensor sharded over some mesh dimension (``Shard``), a DTensor replicated (or
partial) over every mesh dimension."""


def placements(params: Sequence[torch.Tensor]) -> str | None:
    """Each parameter's placement kind, one character each; None when none is a DTensor."""
    if DTensor is None or not any(isinstance(p, DTensor) for p in params):
        return None
    out = []
    for p in params:
        if not isinstance(p, DTensor):
            out.append(PLAIN)
        elif any(pl.is_shard() for pl in p.placements):
            out.append(SHARDED)
        else:
            out.append(REPLICATED)
    return "".join(out)


def readable(t: torch.Tensor) -> bool:
    """Whether ``t``'s storage holds its elements (FSDP2 frees an all-gathered parameter's
    storage between uses). A sparse tensor is readable; a tensor with no storage is not."""
    if t.is_sparse:
        return True
    try:
        nbytes = t.untyped_storage().nbytes()
    except (RuntimeError, NotImplementedError):  # no storage (a wrapper subclass, fake)
        return False
    if t.numel() == 0:
        return True
    extent = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True) if n)
    return nbytes >= (t.storage_offset() + extent) * t.element_size()
