"""Per-optimizer gradient bookkeeping: what each parameter's ``.grad`` holds, in contributions.

A *contribution* is one backward pass (numbered by the tracker) added into one ``.grad``.
For each parameter of a watched optimizer this keeps:

- ``old[k]``: how many contributions in ``.grad`` this optimizer already consumed;
- ``new[k]``: the backward ids of the contributions it has not consumed yet;
- ``refs[k]`` / ``vers[k]``: a weak reference to the ``.grad`` tensor and its ``_version`` at
  the last observation, to tell an accumulation (same object, version + 1) from a reset
  (another object, or an in-place change of content already consumed).

The hooks only append: each parameter's post-accumulate-grad hook is the bound ``append``
of its optimizer's ``incoming`` list (no Python frame per parameter), and the wrapper of
``torch.autograd.backward`` appends a ``-bw`` marker before each backward pass. The lists
are turned into parameter indices once, when a step or a reset reads them (:meth:`pull`).

Resets append to ``pending``; the step that follows judges them.
"""

from __future__ import annotations

import weakref
from bisect import bisect_left
from collections.abc import Sequence
from itertools import islice
from operator import is_
from typing import Any

import torch


class StepAcc:
    """Facts gathered over one step (several consumptions for closure optimizers).

    Handed whole to the writer thread at the end of the step (the tracker starts a new
    one), so the training thread never builds the record itself.
    """

    __slots__ = ("consumed", "fresh", "stale", "leaked", "stale_params", "leaked_params",
                 "fresh_params", "fresh_hits", "bws", "closure_evals", "norms")

    def __init__(self) -> None:
        self.consumed = 0
        self.fresh = 0
        self.stale = 0
        self.leaked = 0
        self.stale_params: set[int] = set()
        self.leaked_params: set[int] = set()
        self.fresh_params: set[int] = set()
        self.fresh_hits: list[list[Any]] = []
        """Hit lists consumed in bulk at this step."""
        self.bws: set[int] = set()
        self.closure_evals = 0
        self.norms: Any = None
        """A :class:`~gradwatch.probe.norms.NormSample` or the host floats of
        :meth:`~gradwatch.probe.norms.CpuPlan.read`, or None when not sampled."""

    def had_fresh(self, k: int) -> bool:
        """Whether parameter ``k`` got a fresh contribution consumed at this step."""
        return k in self.fresh_params or any(k in hits for hits in self.fresh_hits)


class OptState:
    """Everything the probe tracks for one optimizer."""

    __slots__ = ("opt", "uid", "name", "params", "groups", "old", "new", "refs", "vers",
                 "last_grads", "refs_ready", "incoming", "index", "lookup", "hits", "armed_bws",
                 "cur_bw", "lazy_old", "dirty",
                 "norm_plan", "armed", "pre_check", "unhooked", "step", "pending", "acc",
                 "in_step", "instance_hooks", "post_hooked", "shown_stale", "baseline")

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
        self.last_grads: list[torch.Tensor | None] | None = None
        """The grads the last consumption read; their identity and versions are taken
        lazily (:meth:`ensure_observed`). Holding the list costs no memory in the usual
        loop: the zero_grad wrapper drops it right after zero_grad frees the grads. Without
        zero_grad (a hand-written reset or a bug) it lives until the next backward starts."""
        self.refs_ready = True
        self.incoming: list[Any] = []
        """Raw hook output, in order: the parameters themselves (their hooks are this list's
        ``append``) and ``-bw`` backward markers. Never replaced: the hooks hold it."""
        self.index = {id(p): k for k, p in enumerate(params)}
        """``id(param) -> k``: the parameters are held by ``params``, so ids stay theirs."""
        self.lookup = Lookup(self.index)
        """:attr:`index` for the writer thread."""
        self.hits: list[int] = []
        """``incoming`` as indices (:meth:`pull`): param index or ``-bw`` backward marker.
        Folded lazily: the usual step counts it in bulk (the textbook step never pulls: it
        takes ``incoming`` as it is, see :func:`param_indices`)."""
        self.armed_bws: dict[int, ArmedBackward] = {}
        """Backward ids started while this optimizer was armed, with the ``.grad`` state
        around them (the rare path of hand-written resets), until their hits are folded:
        while any is here, steps take the per-parameter way."""
        self.cur_bw = 0
        self.lazy_old: list[list[Any]] = []
        """Hit lists consumed in bulk and not yet added into ``old`` (:func:`param_indices`)."""
        self.dirty = False
        """``old``/``new`` may hold content (else they are all zero/empty)."""
        self.norm_plan: Any = False
        """``False`` until made; then a :class:`~gradwatch.probe.norms.CpuPlan` or None."""
        self.armed = False
        """True once a step consumed and no optimizer-level zero_grad followed: hooks then
        record the grad object and version of each contribution (the rare, buggy path)."""
        self.pre_check: PreCheck | None = None
        self.unhooked: list[int] = []
        """Parameters without a hook yet (not requiring grad at attach time)."""
        self.step = 0
        self.pending: list[PendingReset] = []
        """Resets since the last step (the step that follows judges them)."""
        self.acc = StepAcc()
        self.in_step = False
        """Inside a closure step (its record is emitted by the post hook)."""
        self.instance_hooks = True
        """The step hooks are this optimizer's own (not the global ones of ``run``)."""
        self.post_hooked = False
        self.shown_stale = False
        self.baseline: list[tuple[torch.Tensor, Any, int] | None] | None = None
        """Bug path only: copies of the gradients consumed last step, for exact fresh norms."""

    def add(self, params: list[torch.Tensor], groups: list[int]) -> None:
        """Parameters added to the optimizer (``add_param_group``), indexed after the others."""
        n0, n = len(self.params), len(params)
        self.index.update((id(p), n0 + j) for j, p in enumerate(params))
        self.params.extend(params)
        self.groups.extend(groups)
        self.old.extend([0] * n)
        self.new.extend([] for _ in range(n))
        grads = [p.grad for p in params]
        if self.last_grads is not None:  # identities taken later, from this list
            self.last_grads = [*self.last_grads, *grads]
            self.refs.extend([None] * n)
            self.vers.extend([0] * n)
        else:
            self.refs.extend(None if g is None else weakref.ref(g) for g in grads)
            self.vers.extend(0 if g is None else g._version for g in grads)
        if self.baseline is not None:
            self.baseline.extend([None] * n)
        self.norm_plan = False  # shapes changed: plan again

    def ensure_observed(self) -> None:
        """Turn the held grads into weak references and versions (once per step)."""
        if self.refs_ready:
            return
        grads = self.last_grads
        if grads is None:
            grads = [p.grad for p in self.params]
        ref = weakref.ref
        self.refs = [None if g is None else ref(g) for g in grads]
        self.vers = [0 if g is None else g._version for g in grads]
        self.last_grads = None
        self.refs_ready = True

    def drop_observed(self) -> None:
        """After a zero_grad: nothing to compare with any more."""
        self.last_grads = None
        self.refs_ready = True

    def pull(self) -> None:
        """Append ``incoming`` to ``hits`` as indices (once per step or reset, in bulk)."""
        incoming = self.incoming
        if not incoming:
            return
        index = self.index
        head = incoming[0]
        try:  # the usual list, parameters after its first entry, mapped without a loop
            tail = list(map(index.__getitem__, map(id, incoming[1:])))
        except KeyError:  # a marker among them (an int's id is never a live parameter's)
            self.hits += [h if type(h) is int else index[id(h)] for h in incoming]
        else:
            self.hits.append(head if type(head) is int else index[id(head)])
            self.hits += tail
        incoming.clear()  # in place: the hooks hold its append

    def sync(self) -> None:
        """Fold raw hits into the per-parameter ``new`` lists (the rare, per-param paths)."""
        self.pull()
        if not self.hits:
            return
        hits, self.hits = self.hits, []
        self.sync_old()
        bw = self.cur_bw
        new = self.new
        armed = self.armed_bws
        seen = armed.get(bw) if armed else None
        for h in hits:
            if h < 0:
                bw = -h
                seen = armed.get(bw) if armed else None
            elif seen is None:
                new[h].append(bw)
                self.dirty = True
            else:
                self._rich(h, bw, seen)
        self.cur_bw = bw
        if armed:  # a backward still running gets more contributions; the others are done
            self.armed_bws = {b: a for b, a in armed.items() if a.grads is None}

    def sync_old(self) -> None:
        """Add the bulk-consumed hits into the per-parameter ``old`` counts."""
        if not self.lazy_old:
            return
        old, index = self.old, self.index
        for hits in self.lazy_old:
            for h in param_indices(hits, index):
                if h >= 0:
                    old[h] += 1
                    self.dirty = True
        self.lazy_old = []

    def _rich(self, k: int, bw: int, seen: ArmedBackward) -> None:
        """An armed-path contribution: was the content it landed on reset first?"""
        self.ensure_observed()
        self.dirty = True
        g, before, after = seen.of(k, self.params[k])
        if g is None:  # gone again since (p.grad = None after the backward): the step sees it
            self.new[k].append(bw)
            return
        r = self.refs[k]
        old_g = r() if r is not None else None
        if old_g is not g:
            # Another object: whatever the old one held is gone (p.grad = None / replaced).
            if self.old[k] or self.new[k]:
                self.reset(k, "set_none" if old_g is None else "replaced")
            self.refs[k] = weakref.ref(g)
        elif self.old[k] and not self.new[k]:
            if before != self.vers[k] and g._base is None:
                # Same object changed in place before this backward while it held only
                # consumed content: a p.grad.zero_() outside zero_grad. (A view, such as
                # DDP's gradient_as_bucket_view, shares its version counter with its
                # bucket: any other parameter's accumulation bumps it, so only values tell.)
                self.reset(k, "zero_")
            elif self.pre_check is not None and self.pre_check.was_zero(k, bw):
                self.reset(k, "zero_")  # p.grad.data.zero_(): no version bump, values zero
        self.vers[k] = after
        self.new[k].append(bw)

    def reset(self, k: int, how: str) -> None:
        """Record that parameter ``k``'s gradient content was removed by ``how``."""
        self.sync()
        self.sync_old()
        removed = self.new[k]
        if removed:
            self.new[k] = []  # hand the list itself to pending; never share it
        self.old[k] = 0
        self.pending.append((how, [k], [(k, removed)] if removed else [], ()))

    def reset_all(self, how: str) -> None:
        """Every parameter was reset (optimizer zero_grad): in bulk where possible.

        The usual reset (every gradient consumed in bulk, nothing pending) hands the
        consumed hit lists over as they are; the writer thread turns them into indices.
        """
        if self.incoming or self.hits:
            self.sync()
        lazy, self.lazy_old = self.lazy_old, []
        if not self.dirty:
            self.pending.append((how, (), (), lazy))
            return
        old, new = self.old, self.new
        ks = [k for k, (o, nw) in enumerate(zip(old, new, strict=True)) if o or nw]
        removed = [(k, new[k]) for k in ks if new[k]]
        for k, _ in removed:
            new[k] = []
        self.old = [0] * len(old)
        self.dirty = False
        self.pending.append((how, ks, removed, lazy))


def _as_left(hits: list[Any]) -> bool:
    """Whether a consumed hit list is as the hooks left it (the usual step keeps it so, see
    :func:`~gradwatch.probe.judge.plain_step`): its backward's marker, then the parameters
    themselves. Any other holds indices already."""
    return len(hits) > 1 and type(hits[1]) is not int


def param_indices(hits: list[Any], index: dict[int, int]) -> list[int]:
    """The parameter indices in a consumed hit list, looked up where it is as the hooks
    left it (an index list's negative backward markers left in)."""
    if not _as_left(hits):
        return hits
    return list(map(index.__getitem__, map(id, islice(hits, 1, None))))


class Lookup:
    """The writer thread's :func:`param_indices`, for one optimizer: a textbook loop's
    hooks append the same parameters in the same order every step, so the last list looked
    up is kept (and the sorted parameters of a reset that consumed it) and the next one is
    checked against it by identity, which costs a fraction of looking each parameter up.
    Used by one thread only."""

    __slots__ = ("index", "_last", "_looked_up", "_ordered")

    def __init__(self, index: dict[int, int]) -> None:
        self.index = index
        self._last: list[Any] = []
        self._looked_up: list[int] = []
        self._ordered: list[int] | None = None

    def params(self, hits: list[Any]) -> list[int]:
        """:func:`param_indices`, from the memo when ``hits`` holds the last list's
        parameters."""
        if not _as_left(hits):
            return hits
        last = self._last
        if len(hits) != len(last) or not all(map(is_, islice(hits, 1, None),
                                                 islice(last, 1, None))):
            self._looked_up = param_indices(hits, self.index)
            self._last = hits
            self._ordered = None
        return self._looked_up

    def reset_params(self, parts: list[tuple[Sequence[int], Sequence[list[Any]]]]
                     ) -> list[int]:
        """The sorted indices of the parameters that resets of one kind covered, each reset
        given as ``(its parameters, the hit lists it cleared)``. The textbook loop's reset
        (one ``zero_grad`` clearing one step's list) reuses the last answer."""
        if len(parts) == 1 and not parts[0][0] and len(parts[0][1]) == 1:
            looked_up = self.params(parts[0][1][0])
            if looked_up is self._looked_up:  # a list as the hooks left it: no markers
                if self._ordered is None:
                    self._ordered = sorted(set(looked_up))
                return list(self._ordered)
        params: set[int] = set()
        for ks, hit_lists in parts:
            params.update(ks)
            for hits in hit_lists:
                params.update(self.params(hits))
        ordered = sorted(params)
        return ordered[bisect_left(ordered, 0):]  # without the backward markers


PendingReset = tuple[str, Sequence[int], Sequence[tuple[int, list[int]]], Sequence[list[Any]]]
"""A reset since the last step: ``(how, params, [(param, removed backward ids)], hit
lists)``; the reset parameters are ``params`` plus the indices in the consumed hit lists."""


class PreCheck:
    """Norms of consumed gradients taken when a backward starts (armed optimizers only).

    ``p.grad.data.zero_()`` changes values without a version bump, so a contribution added
    on top of it looks like an accumulation onto consumed content. The wrapper of
    ``torch.autograd.backward`` takes these norms before the engine runs (device tensors,
    no sync); the next fold reads them once. A sparse gradient, not normed, follows the
    verdict of the others.
    """

    def __init__(self, bw: int, ks: list[int], norms: torch.Tensor) -> None:
        self.bw = bw
        self.ks = ks
        self.norms = norms
        self._vals: dict[int, float] | None = None

    @classmethod
    def take(cls, st: OptState, bw: int) -> PreCheck | None:
        st.sync_old()
        ks, grads = [], []
        for k, p in enumerate(st.params):
            g = p.grad
            if g is not None and st.old[k] and not g.is_sparse:
                ks.append(k)
                grads.append(g)
        if not grads:
            return None
        with torch.no_grad():  # device tensors only: no sync
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
    """The ``.grad`` state around one backward of an armed optimizer (hand-written resets):
    versions before the engine ran, gradients and versions after it returned.

    Contributions are judged against these instead of inside a hook. A backward still
    running (a fold in its middle) has no ``after`` yet: the live gradient stands in.
    """

    __slots__ = ("before", "grads", "after")

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.before = [-1 if (g := p.grad) is None else g._version for p in params]
        self.grads: list[torch.Tensor | None] | None = None
        self.after: list[int] = []

    def done(self, params: list[torch.Tensor]) -> None:
        """The engine returned: take the gradients the contributions landed on."""
        grads = [p.grad for p in params]
        self.grads = grads
        self.after = [0 if g is None else g._version for g in grads]

    def of(self, k: int, p: torch.Tensor) -> tuple[torch.Tensor | None, int, int]:
        """``(grad, version before, version after)`` of parameter ``k`` (``p``)."""
        before = self.before[k] if k < len(self.before) else -1  # added since: was None
        if self.grads is None or k >= len(self.grads):
            g = p.grad
            return g, before, 0 if g is None else g._version
        return self.grads[k], before, self.after[k]
