"""The fresh part of gradients that also hold old content, measured at the backward boundary.

Thread: training (the backward wrapper and the step hooks, through a ledger's norm schedule).

On a step that re-applies old gradients (a missed reset) the fresh part of a ``.grad`` is what
the backwards since the optimizer's last step added to it. It is taken around each backward
that starts while the optimizer is armed (see :mod:`gradwatch.probe.handresets`): a copy of
each gradient holding consumed content before the engine runs; when it returns, the
difference is added into a running fresh sum, and the norms of each gradient (``acc``) and
of its fresh part (``fresh``) are taken. A gradient that held nothing consumed is all fresh.

Between that backward and the step, ``clip_grad_norm_``, ``GradScaler.unscale_``, DDP's
averaging and ``p.grad *= c`` rescale a gradient in place: old and fresh alike. So the step
reports each gradient's fresh norm as the norm it read times ``fresh / acc`` as measured when
the backward returned (:meth:`FreshPart.scaled`), and drift stays the ratio of accumulated to
fresh gradient, whatever the rescale. Nothing is read to the host here.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch

from gradwatch.probe.shards import GradReader


class FreshPart:
    """The fresh part of one optimizer's gradients since its last step. Owned by its norm
    schedule, which clears it when a step consumes the gradients."""

    __slots__ = ("_before", "_sums", "_left", "_acc", "_fresh", "_ks", "_reader")

    def __init__(self, reader: GradReader) -> None:
        self._reader = reader
        self._before: list[torch.Tensor | None] | None = None
        """Copies taken when the running backward started (None between backwards)."""
        self._sums: dict[int, torch.Tensor] = {}
        """Parameter -> fresh sum, for gradients holding consumed content."""
        self._left: list[weakref.ref[torch.Tensor] | None] = []
        self._acc: torch.Tensor | None = None
        self._fresh: torch.Tensor | None = None
        self._ks: dict[int, int] = {}
        """Parameter -> position in :attr:`_acc` and :attr:`_fresh`."""

    def begin(self, params: Sequence[torch.Tensor], old: Sequence[int]) -> None:
        """A backward starts: copy the gradients holding consumed content (``old[k]``
        consumed contributions)."""
        before: list[torch.Tensor | None] = []
        with torch.no_grad():
            for k, g in enumerate(self._reader.grads(params)):
                if g is None or g.is_sparse or not (old[k] if k < len(old) else 0):
                    before.append(None)
                else:
                    before.append(g.detach().clone())
        self._before = before

    def end(self, params: Sequence[torch.Tensor]) -> None:
        """The engine returned: add what it added into the fresh sums; take the norms."""
        before, self._before = self._before, None
        if before is None:
            return
        grads = self._reader.grads(params)
        sums = self._sums
        with torch.no_grad():
            ks, after, was = [], [], []
            for k, (g, b) in enumerate(zip(grads, before, strict=False)):
                if b is None:
                    if g is None or g.is_sparse or k not in sums:
                        continue
                    sums.pop(k)  # reset since (p.grad = None): all fresh now
                elif g is not None and not g.is_sparse and g.shape == b.shape:
                    ks.append(k)
                    after.append(g.detach())
                    was.append(b)
            if ks:
                for k, d in zip(ks, torch._foreach_sub(after, was), strict=True):
                    s = sums.get(k)
                    sums[k] = d if s is None else s.add_(d)
            present = [(k, g) for k, g in enumerate(grads) if g is not None and not g.is_sparse]
            if not present:
                self._acc = self._fresh = None
                return
            acc = _stack(torch._foreach_norm([g.detach() for _, g in present]))
            fresh = acc
            pos = {k: j for j, (k, _) in enumerate(present)}
            measured = [k for k in sums if k in pos]
            if measured:
                fresh = acc.clone()
                sn = _stack(torch._foreach_norm([sums[k] for k in measured]))
                fresh[[pos[k] for k in measured]] = sn.to(fresh.device, fresh.dtype)
        self._acc, self._fresh, self._ks = acc, fresh, pos
        ref = weakref.ref
        self._left = [None if g is None else ref(g) for g in grads]

    def scaled(self, ks: Sequence[int], grads: Sequence[torch.Tensor | None],
               norms: torch.Tensor) -> tuple[list[int], torch.Tensor | None]:
        """The fresh norms of parameters ``ks`` as the step reads them, given the norms it
        read (``norms[j]`` for ``ks[j]``): ``(positions j answered, their fresh norms)``.
        A gradient measured by no backward, or replaced since the last one, is left out."""
        acc, fresh = self._acc, self._fresh
        if acc is None or fresh is None:
            return [], None
        left, pos = self._left, self._ks
        js, at = [], []
        for j, k in enumerate(ks):
            i = pos.get(k)
            if i is None or k >= len(left):
                continue
            r = left[k]
            if r is not None and r() is grads[k]:
                js.append(j)
                at.append(i)
        if not js:
            return [], None
        a = acc[at].to(norms.device, norms.dtype)
        f = fresh[at].to(norms.device, norms.dtype)
        # fresh / acc where acc > 0; a gradient that was all zero has no fresh part
        ratio = torch.where(a > 0, f / torch.where(a > 0, a, torch.ones_like(a)),
                            torch.zeros_like(a))
        return js, norms[js] * ratio

    def holding(self) -> bool:
        """Whether a measured fresh part is held."""
        return bool(self._sums) or self._acc is not None

    def clear(self) -> None:
        """A step consumed the gradients: nothing is fresh any more."""
        if self._sums or self._acc is not None:
            self._sums = {}
            self._acc = self._fresh = None
            self._left = []
            self._ks = {}


def _stack(ns: Sequence[torch.Tensor]) -> torch.Tensor:
    try:
        return torch.stack(list(ns))
    except RuntimeError:  # several devices or dtypes: gather on the host (bug path only)
        return torch.stack([n.detach().float().cpu() for n in ns])
