"""Hand-written resets: ``p.grad = None``, a replaced ``.grad`` or ``p.grad.zero_()`` outside
zero_grad, told from an accumulation by the ``.grad`` objects and their versions.

Thread: training (the backward wrapper and the step hooks, through a ledger).

Only *armed* optimizers pay for this: a step consumed their gradients and no reset of all of
them followed (an optimizer's zero_grad, or a Module.zero_grad covering every parameter).
For each backward started while armed the wrapper of ``torch.autograd.backward`` takes the
``.grad`` state around the engine (:class:`ArmedBackward`, and :class:`PreCheck` for a
zeroing that bumps no version); the ledger's next fold judges each contribution of that
backward against it (:meth:`HandResets.landed`).
"""

from __future__ import annotations

import weakref

import torch

from gradwatch.probe.shards import GradReader


class HandResets:
    """One optimizer's ``.grad`` objects and versions as its last consumption read them, and
    the state around the backwards started while it was armed. Owned by its ledger."""

    __slots__ = ("params", "refs", "vers", "held", "ready", "backwards", "pre_check",
                 "reader")

    def __init__(self, params: list[torch.Tensor], reader: GradReader) -> None:
        self.params = params
        """The ledger's own list (parameters added later are appended to it)."""
        self.reader = reader
        n = len(params)
        self.refs: list[weakref.ref[torch.Tensor] | None] = [None] * n
        self.vers: list[int] = [0] * n
        self.held: list[torch.Tensor | None] | None = None
        """The grads the last consumption read, turned into :attr:`refs` and :attr:`vers`
        only when needed (:meth:`observe`)."""
        # Holding the list costs no memory in the usual loop: zero_grad drops it (forget)
        # right after freeing the grads.
        self.ready = True
        """:attr:`refs` and :attr:`vers` are up to date."""
        self.backwards: dict[int, ArmedBackward] = {}
        """Backward id -> the ``.grad`` state around it, until the ledger folds its hits:
        while any is here, steps take the per-parameter way."""
        self.pre_check: PreCheck | None = None

    def hold(self, grads: list[torch.Tensor | None]) -> None:
        """A step consumed ``grads``: their identities are taken lazily, if ever needed.
        (The textbook step does the same inline, :meth:`Contributions.take_textbook`.)"""
        self.held = grads
        self.ready = False
        self.pre_check = None

    def observe(self) -> None:
        """Turn the held grads into weak references and versions (at most once a step)."""
        if self.ready:
            return
        grads = self.held
        if grads is None:
            grads = self.reader.grads(self.params)
        ref = weakref.ref
        self.refs = [None if g is None else ref(g) for g in grads]
        self.vers = [0 if g is None else g._version for g in grads]
        self.held = None
        self.ready = True

    def forget(self) -> None:
        """After a zero_grad: nothing to compare with any more. (The usual reset does the
        same inline, :meth:`Contributions.reset_all`.)"""
        self.held = None
        self.ready = True

    def extend(self, grads: list[torch.Tensor | None]) -> None:
        """Parameters were added (already appended to :attr:`params`), holding ``grads``."""
        n = len(grads)
        if self.held is not None:  # identities taken later, from this list
            self.held = [*self.held, *grads]
            self.refs.extend([None] * n)
            self.vers.extend([0] * n)
        else:
            self.refs.extend(None if g is None else weakref.ref(g) for g in grads)
            self.vers.extend(0 if g is None else g._version for g in grads)

    def current(self, k: int) -> torch.Tensor | None:
        """The ``.grad`` object parameter ``k`` held when last observed, if still alive."""
        r = self.refs[k]
        return r() if r is not None else None

    def watch(self, bw: int, old: list[int]) -> ArmedBackward:
        """Backward ``bw`` starts while armed: take the ``.grad`` state before it (``old``:
        the consumed contributions per parameter, folded)."""
        self.observe()
        self.pre_check = PreCheck.take(self.reader.grads(self.params), old, bw)
        seen = self.backwards[bw] = ArmedBackward(self.params, self.reader)
        return seen

    def retire_done(self) -> None:
        """After a fold: forget the backwards that ended (a running one gets more hits)."""
        self.backwards = {b: a for b, a in self.backwards.items() if a.grads is None}

    def landed(self, k: int, bw: int, seen: ArmedBackward, consumed: int,
               unconsumed: bool) -> str | None:
        """A contribution of backward ``bw`` landed on parameter ``k`` (holding ``consumed``
        consumed contributions and unconsumed ones if ``unconsumed``): the kind of reset that
        removed that content first, or None (an accumulation)."""
        self.observe()
        g, before, after = seen.of(k, self.params[k])
        if g is None:  # gone again since (p.grad = None after the backward): the step sees it
            return None
        how = None
        old_g = self.current(k)
        if old_g is not g:
            # Another object: whatever the old one held is gone (p.grad = None / replaced).
            if consumed or unconsumed:
                how = "set_none" if old_g is None else "replaced"
            self.refs[k] = weakref.ref(g)
        elif consumed and not unconsumed:
            if before != self.vers[k] and g._base is None:
                # Changed in place before this backward while it held only consumed content:
                # a p.grad.zero_(). (A view, such as DDP's gradient_as_bucket_view, shares its
                # version counter with its bucket, so only values tell.)
                how = "zero_"
            elif self.pre_check is not None and self.pre_check.was_zero(k, bw):
                how = "zero_"  # p.grad.data.zero_(): no version bump, values zero
        self.vers[k] = after
        return how


class PreCheck:
    """Norms of consumed gradients taken when a backward starts (armed optimizers only).

    ``p.grad.data.zero_()`` changes values without a version bump, so a contribution added on
    top of it looks like an accumulation onto consumed content; these norms tell. A sparse
    gradient, not normed, follows the verdict of the others.
    """

    def __init__(self, bw: int, ks: list[int], norms: torch.Tensor) -> None:
        self.bw = bw
        self.ks = ks
        self.norms = norms
        self._vals: dict[int, float] | None = None

    @classmethod
    def take(cls, now: list[torch.Tensor | None], old: list[int], bw: int
             ) -> PreCheck | None:
        """The norms of the gradients ``now`` holding consumed content (``old[k]``), or
        None."""
        ks, grads = [], []
        for k, g in enumerate(now):
            if g is not None and old[k] and not g.is_sparse:
                ks.append(k)
                grads.append(g)
        if not grads:
            return None
        with torch.no_grad():  # device tensors, read at the next fold: no sync here
            return cls(bw, ks, torch.stack(list(torch._foreach_norm(grads))))

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


class ArmedBackward:
    """The ``.grad`` state around one backward of an armed optimizer: versions before the
    engine ran, gradients and versions after it returned.

    A backward still running (a fold in its middle) has no ``after`` yet: the live gradient
    stands in.
    """

    __slots__ = ("before", "grads", "after", "reader")

    def __init__(self, params: list[torch.Tensor], reader: GradReader) -> None:
        self.reader = reader
        self.before = [-1 if g is None else g._version for g in reader.grads(params)]
        self.grads: list[torch.Tensor | None] | None = None
        self.after: list[int] = []

    def done(self, params: list[torch.Tensor]) -> None:
        """The engine returned: take the gradients the contributions landed on."""
        grads = self.reader.grads(params)
        self.grads = grads
        self.after = [0 if g is None else g._version for g in grads]

    def of(self, k: int, p: torch.Tensor) -> tuple[torch.Tensor | None, int, int]:
        """``(grad, version before, version after)`` of parameter ``k`` (``p``)."""
        before = self.before[k] if k < len(self.before) else -1  # added since: was None
        if self.grads is None or k >= len(self.grads):
            g = self.reader.grad(p)
            return g, before, 0 if g is None else g._version
        return self.grads[k], before, self.after[k]
