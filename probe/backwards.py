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

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gradwatch.probe.ledger import Ledger

_PRUNE_AT = 50_000
"""First consumers kept before the oldest are forgotten, down to the last :data:`_KEEP`
backwards (a reset never removes contributions that old)."""
_KEEP = 20_000


class Backwards:
    """What the ledgers of one session share: backward numbers and phases, the first step
    that consumed each backward, the backwards a skipped step looked at, and which ledgers
    are armed (their consumed gradients not cleared by a zero_grad)."""

    __slots__ = ("last", "phase", "_stepped", "_first", "_observed", "armed", "_ledgers")

    def __init__(self) -> None:
        self.last = 0
        """The number of the last backward (they count from 1)."""
        self.phase = 0
        self._stepped = False
        self._first: dict[int, tuple[int, int]] = {}
        """Backward -> ``(ledger uid, phase)`` of the first step that consumed it."""
        self._observed: set[int] = set()
        self.armed: set[Ledger] = set()
        """Ledgers that take the ``.grad`` state around each backward (see
        :mod:`gradwatch.probe.handresets`)."""
        self._ledgers = 0

    @property
    def first_consumers(self) -> int:
        """How many backwards' first consumers are kept."""
        return len(self._first)

    def join(self) -> int:
        """A ledger joins the session: its uid."""
        self._ledgers += 1
        return self._ledgers - 1

    def begin(self) -> int:
        """A backward starts: its number (after a step, it starts a new phase)."""
        bw = self.last = self.last + 1
        if self._stepped:
            self.phase += 1
            self._stepped = False
        return bw

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
        if self._ledgers < 2:
            return True
        first, phase = self._first, self.phase
        for b in bws:
            c = first.get(b)
            if c is not None and c[0] != uid and c[1] < phase:
                return False
        for b in bws:
            first.setdefault(b, (uid, phase))
        return True

    def leaked(self, uid: int, bws: list[int]) -> int:
        """How many of one parameter's contributions (from backwards ``bws``) leaked to ledger
        ``uid``; the others are claimed, as by :meth:`claim`, one by one."""
        first, phase = self._first, self.phase
        n = 0
        for b in bws:
            c = first.get(b)
            if c is None:
                first[b] = (uid, phase)
            elif c[0] != uid and c[1] < phase:
                n += 1
        return n

    def lost(self, uid: int, bws: list[int]) -> int:
        """How many contributions of backwards ``bws``, removed by a reset, ledger ``uid``
        lost (see the module docstring)."""
        observed, first = self._observed, self._first
        return sum(1 for b in bws if b not in observed and first.get(b, (uid,))[0] == uid)

    def observe(self, bws: Iterable[int]) -> None:
        """A skipped step looked at the contributions of backwards ``bws``."""
        self._observed.update(bws)

    def arm(self, ledger: Ledger) -> None:
        self.armed.add(ledger)

    def disarm(self, ledger: Ledger) -> None:
        self.armed.discard(ledger)

    def stepped(self) -> None:
        """A step ended: the next backward starts a new phase; forget old backwards."""
        self._stepped = True
        if len(self._first) > _PRUNE_AT:
            cut = self.last - _KEEP
            self._first = {b: v for b, v in self._first.items() if b >= cut}
            self._observed = {b for b in self._observed if b >= cut}
