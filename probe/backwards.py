"""Backward passes across the optimizers of one watch session: numbers, phases, first
consumers.

Thread: training (the backward wrapper and the step hooks, through the tracker and ledgers).

A *phase* ends when a backward starts after a step. A contribution *leaks* to an optimizer
when its backward was consumed by another optimizer's step in an earlier phase; a removed
contribution is *lost* to an optimizer only when no other optimizer's step consumed its
backward (DCGAN: D's zero_grad clears what G's backward left in D's grads, fine) and no
GradScaler-skipped step looked at it (the next reset throws non-finite gradients away on
purpose).
"""

from __future__ import annotations

import weakref
from bisect import bisect_right
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from typing import Any, Generic, TypeVar

import torch

from gradwatch.probe.deliberate import shares_graph, tensors_of, wrote_input_grad

L = TypeVar("L")
"""What the session's ledgers are (:class:`~gradwatch.probe.ledger.Ledger`, which imports
this module: it is never imported back)."""

_PRUNE_AT = 50_000
"""First consumers kept before the oldest are forgotten, down to the last :data:`_KEEP`
backwards (a reset never removes contributions that old)."""
_KEEP = 20_000
_PRUNE_CHECK = 1024
"""Backwards between two checks of what is kept against :data:`_PRUNE_AT`."""


class Backwards(Generic[L]):
    """What the ledgers of one session share: backward numbers and phases, the first step
    that consumed each backward, the backwards a skipped step looked at, which ledgers are
    armed (their consumed gradients not cleared by a zero_grad) or watch their gradients
    after each backward (a reset threw contributions away), where each backward was called,
    and the graph of the last one."""

    __slots__ = ("last", "phase", "stepped", "_first", "_observed", "armed", "lossy",
                 "_ledgers", "_site_bws", "_site_ids", "roots", "roots_bw", "held",
                 "phase_began", "_walked", "retained", "through", "single", "prune_check")

    def __init__(self, held: Mapping[Any, Any] | None = None) -> None:
        self.last = 0
        """The number of the last backward (they count from 1)."""
        self.prune_check = _PRUNE_CHECK
        """The backward at which what is kept is next checked against :data:`_PRUNE_AT`."""
        self.phase = 0
        self.stepped = False
        """A step ended since the last backward: the next one starts a new phase. Set by
        the ledger that stepped (a field, not a method: no frame on the usual step)."""
        self.phase_began = False
        """The last backward started a phase (the first backward after a step)."""
        self._first: dict[int, tuple[int, int]] = {}
        """Backward -> ``(ledger uid, phase)`` of the first step that consumed it."""
        self._observed: set[int] = set()
        self.armed: set[L] = set()
        """Ledgers that take the ``.grad`` state around each backward (see
        :mod:`gradwatch.probe.handresets`); a ledger adds itself when its step consumed its
        gradients and leaves when a reset cleared them (as :attr:`lossy`)."""
        self.lossy: set[L] = set()
        """Ledgers that take their gradients after each backward until their next step: a
        reset threw contributions away (see :mod:`gradwatch.probe.deliberate`)."""
        self._ledgers = 0
        self.single = True
        """One ledger in the session: nothing can leak, :meth:`claim` records nothing."""
        self._site_bws: list[int] = []
        self._site_ids: list[int] = []
        """Where backwards were called, as runs: from backward ``_site_bws[i]`` on, site
        ``_site_ids[i]`` (a loop calls backward from one line: one run)."""
        self.roots: Any = None
        """What the last backward started from (its ``tensors``), which holds its graph's
        nodes (their saved tensors are freed by then); None after a ``retain_graph``
        backward, whose saved tensors must not outlive the user's reference, and once a
        textbook step consumed that backward (the ledger lets go)."""
        self.roots_bw = 0
        self.held: Mapping[Any, Any] = held if held is not None else {}
        """The parameters some watched optimizer holds (any container)."""
        self._walked: tuple[int, bool] = (0, False)
        """The last graph walked: ``(backward, whether it wrote an input's gradient)``."""
        self.retained: tuple[int, list[weakref.ref[torch.Tensor]]] | None = None
        """The last backward, when it retained its graph: its number and its roots, weakly
        (the graph must not outlive the user's reference)."""
        self.through: set[int] = set()
        """Backwards of this phase whose retained graph the next backward ran through, seen
        while a reset's loss awaited the step (loss surgery, :mod:`~gradwatch.probe.deliberate`)."""

    @property
    def first_consumers(self) -> int:
        """How many backwards' first consumers are kept."""
        return len(self._first)

    def join(self) -> int:
        """A ledger joins the session: its uid."""
        self._ledgers += 1
        self.single = self._ledgers < 2
        return self._ledgers - 1

    def begin(self, site: int = 0, roots: Any = None, tensors: Any = None) -> int:
        """A backward starts, called at ``site`` from ``roots`` (None when it retains its
        graph; ``tensors`` as passed): its number (after a step, it starts a new phase)."""
        bw = self.last = self.last + 1
        if self.stepped:
            self.phase += 1
            self.stepped = False
            self.phase_began = True
            if self.through:
                self.through.clear()
        else:
            self.phase_began = False
        # (each backward adds at most one of each: checked every _PRUNE_CHECK backwards,
        # by a comparison: ``%`` is a C call, costly where this runs, see docs/design.md §2)
        if bw >= self.prune_check:
            self.prune_check = bw + _PRUNE_CHECK
            if len(self._first) > _PRUNE_AT or len(self._site_bws) > _PRUNE_AT:
                self._prune()
        kept = self.retained
        if kept is not None and self.lossy and kept[0] == bw - 1:
            # a reset lost the last backward's contributions: did it retain the graph this
            # backward runs through? (walked only then: rare)
            first = [t for r in kept[1] if (t := r()) is not None]
            if first and shares_graph(first, tensors):
                self.through.add(kept[0])
        self.retained = None
        if roots is None and tensors is not None:
            self.retained = (bw, [weakref.ref(t) for t in tensors_of(tensors)])
        ids = self._site_ids
        if site and (not ids or ids[-1] != site):
            self._site_bws.append(bw)
            ids.append(site)
        self.roots = roots
        self.roots_bw = bw
        return bw

    def wrote_input_grad(self, bws: AbstractSet[int]) -> bool:
        """Whether the last backward is among ``bws`` and wrote a gradient into a leaf that
        is no parameter (see :func:`~gradwatch.probe.deliberate.wrote_input_grad`)."""
        bw = self.roots_bw
        if self.roots is None or bw not in bws:
            return False
        if self._walked[0] != bw:  # once per backward, however many resets ask
            self._walked = (bw, wrote_input_grad(self.roots, self.held))
        return self._walked[1]

    def site_of(self, bw: int) -> int:
        """Where backward ``bw`` was called (0: not known)."""
        i = bisect_right(self._site_bws, bw) - 1
        return self._site_ids[i] if i >= 0 else 0

    def found(self) -> int:
        """Gradient content found at attach time: a backward of its own, never judged as
        lost (its origin was not seen)."""
        bw = self.last = self.last + 1
        self._observed.add(bw)
        return bw

    def claim(self, uid: int, bws: Iterable[int]) -> bool:
        """Record ledger ``uid``'s step as the first consumer of backwards ``bws``. False,
        recording nothing, when one of them leaked. With one ledger nothing can leak and
        nothing is recorded (a ledger that joins later holds no contribution from before)."""
        if self.single:
            return True
        first, phase = self._first, self.phase
        for b in bws:
            c = first.get(b)
            if c is not None and c[0] != uid and c[1] < phase:
                return False
        for b in bws:
            first.setdefault(b, (uid, phase))
        return True

    def leaked(self, uid: int, bws: list[int]) -> list[int]:
        """Those of one parameter's contributions (from backwards ``bws``) that leaked to
        ledger ``uid``; the others are claimed, as by :meth:`claim`, one by one."""
        first, phase = self._first, self.phase
        out = []
        for b in bws:
            c = first.get(b)
            if c is None:
                first[b] = (uid, phase)
            elif c[0] != uid and c[1] < phase:
                out.append(b)
        return out

    def lost(self, uid: int, bws: list[int]) -> list[int]:
        """Those of the contributions of backwards ``bws``, removed by a reset, that ledger
        ``uid`` lost (see the module docstring)."""
        observed, first = self._observed, self._first
        return [b for b in bws if b not in observed and first.get(b, (uid,))[0] == uid]

    def observe(self, bws: Iterable[int]) -> None:
        """A skipped step looked at the contributions of backwards ``bws``."""
        self._observed.update(bws)

    def _prune(self) -> None:
        """Forget old backwards (when many are kept): a reset never removes contributions
        that old."""
        cut = self.last - _KEEP
        self._first = {b: v for b, v in self._first.items() if b >= cut}
        self._observed = {b for b in self._observed if b >= cut}
        i = max(0, bisect_right(self._site_bws, cut) - 1)  # keep the run holding cut
        del self._site_bws[:i], self._site_ids[:i]
