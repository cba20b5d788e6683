"""What the training thread hands the writer thread for one step: plain facts, no code that
judges.

Thread: facts are made on the training thread and read on the writer thread, never changed
after the handover (the ledger starts new lists and a new tally for its next step); the two
functions at the end are pure and run on either.

A *hit list* is what the hooks append, in order: the parameters themselves (each hook is the
list's ``append``) and ``-bw`` markers before each backward pass. The training thread turns
it into parameter indices only when it has to (:func:`param_indices`); the textbook step
hands it over as the hooks left it, and the writer thread looks its parameters up.
"""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Any, NamedTuple

from gradwatch.verdict import carries_facts

if TYPE_CHECKING:
    import torch

Hits = list[Any]
"""A hit list (see the module docstring): parameters or indices, and ``-bw`` markers."""


class StepCount:
    """The steps a session's optimizers took so far (all of them, ``manual`` included): the
    tracker counts, the parts it hands this to read :attr:`n`."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0


class ResetFact(NamedTuple):
    """A reset since the previous step. The parameters it covered are :attr:`params` plus
    those in :attr:`cleared`."""

    how: str
    """The reset kind (``optimizer_zero_grad``, ``module_zero_grad``, ``set_none``, ...)."""
    params: Sequence[int]
    """Indices of parameters reset one by one."""
    removed: Sequence[tuple[int, list[int]]]
    """``(param, backward ids)`` of the contributions it removed before any step read them."""
    cleared: Sequence[Hits]
    """Hit lists a bulk-counted step consumed, cleared whole by this reset."""
    site: int = 0
    """Where it was called (:mod:`gradwatch.probe.sites`; 0: a reset written by hand)."""
    used: bool = False
    """What it removed had been used on purpose (:mod:`gradwatch.probe.deliberate`): never
    judged as lost."""


@dataclass(slots=True)
class NormSample:
    """Norms of one step: device tensors (GPU, the writer thread reads them) or host floats
    (CPU, read at once). ``norms[j]`` and ``fresh[j]`` belong to parameter ``ks[j]``; positions
    in ``unknown`` have no exact fresh norm."""

    n_params: int
    ks: Sequence[int]
    norms: torch.Tensor | list[float]
    fresh: torch.Tensor | list[float]
    unknown: list[int]


Norms = NormSample | list[float] | None
"""A step's norms: a :class:`NormSample`, or the usual CPU step's host floats (every
parameter, all of it fresh), or None when not sampled."""


@dataclass(slots=True)
class ResetLoss:
    """What the resets of one kind threw away before a step could read it."""

    discarded: int = 0
    """Contributions removed from parameters that then got a fresh one (inside a window)."""
    after_backward: bool = False
    """Some removed contribution left its parameter with nothing fresh (a late reset)."""
    site: int = 0
    """Where the first reset of this kind that threw something away was called."""


class StepTally:
    """Counts gathered over one step (several consumptions for a closure optimizer), then
    handed over whole: the ledger starts a new one for the next step."""

    __slots__ = ("consumed", "fresh", "stale", "leaked", "stale_params", "leaked_params",
                 "fresh_params", "fresh_hits", "bws", "closure_evals", "norms", "stale_sites",
                 "leaked_bws")

    def __init__(self) -> None:
        self.consumed = 0
        self.fresh = 0
        self.stale = 0
        self.leaked = 0
        self.stale_params: set[int] = set()
        self.leaked_params: set[int] = set()
        self.fresh_params: set[int] = set()
        self.fresh_hits: list[Hits] = []
        """Hit lists consumed in bulk at this step."""
        self.bws: set[int] = set()
        self.closure_evals = 0
        self.norms: Norms = None
        self.stale_sites: set[int] = set()
        """Sites of the backwards whose consumed contributions the step read again."""
        self.leaked_bws: set[int] = set()

    def had_fresh(self, k: int) -> bool:
        """Whether parameter ``k`` got a fresh contribution consumed at this step."""
        return k in self.fresh_params or any(k in hits for hits in self.fresh_hits)


@dataclass(slots=True)
class SiteFacts:
    """Where a step's finding facts come from (site ids, 0 unknown): handed over only with a
    step that has one."""

    step: int = 0
    stale: AbstractSet[int] = frozenset()
    leaked: AbstractSet[int] = frozenset()
    lost: AbstractSet[int] = frozenset()
    """Backwards whose contributions a reset threw away (late or discarded)."""
    fresh: AbstractSet[int] = frozenset()
    """Backwards whose contributions the step read fresh."""
    reset: int = 0
    """A step that re-applied old gradients: where its parameters were last reset."""


@dataclass(slots=True)
class TextbookStep:
    """A step of the textbook loop, taken in one pass: its backward's hit list as the hooks
    left it (the marker, then the parameters), no reset that lost anything."""

    t: float
    opt: str
    step: int
    resets: list[ResetFact]
    index: dict[int, int]
    """The optimizer's ``id(param) -> k``, for the writer's lookups (shared: it only grows,
    when parameters are added)."""
    hits: Hits
    norms: Norms
    roots: list[Any] | None = None
    """The values of its backwards' roots (:mod:`gradwatch.probe.losses`), None unknown."""
    lr: list[float] | None = None
    """Each param group's learning rate at the step (None unknown)."""


@dataclass(slots=True)
class JudgedStep:
    """Any other step: its tally, the resets since the previous step and what they lost."""

    t: float
    opt: str
    step: int
    skipped: bool
    tally: StepTally
    resets: list[ResetFact]
    index: dict[int, int]
    losses: dict[str, ResetLoss]
    """Reset kind -> what the resets of that kind threw away (kinds that lost nothing are
    absent)."""
    late: AbstractSet[int]
    """Parameters left with nothing fresh by a reset after their backward."""
    discarded_params: AbstractSet[int]
    sites: SiteFacts | None = None
    """Set only on a step with a finding fact."""
    roots: list[Any] | None = None
    """The values of its backwards' roots (:mod:`gradwatch.probe.losses`), None unknown."""
    lr: list[float] | None = None
    """Each param group's learning rate at the step (None unknown)."""

    def has_findings(self) -> bool:
        """Whether a finding fact is among them (:func:`gradwatch.verdict.carries_facts` of
        the counts :func:`gradwatch.verdict.fact_counts` reads off the record)."""
        tally = self.tally
        return carries_facts((tally.stale, tally.leaked, len(self.late),
                              len(self.discarded_params)))


StepFacts = TextbookStep | JudgedStep


def as_left(hits: Hits) -> bool:
    """Whether a consumed hit list is as the hooks left it (its backward's marker, then the
    parameters themselves); any other holds indices already."""
    return len(hits) > 1 and type(hits[1]) is not int


def param_indices(hits: Hits, index: dict[int, int]) -> list[int]:
    """The parameter indices of a consumed hit list, looked up where it is as the hooks left
    it (an index list is returned as it is, its negative backward markers left in)."""
    if not as_left(hits):
        return hits
    return list(map(index.__getitem__, map(id, islice(hits, 1, None))))
