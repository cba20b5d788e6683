"""Wire records from the step facts the training thread hands over.

Thread: the writer thread only (imported by :mod:`gradwatch.probe.writer` alone).

Everything a record needs beyond the facts is done here, off the training thread: looking
the parameters of a hit list up, sorting index sets, summing resets, and copying sampled
device norms to the host.
"""

from __future__ import annotations

import logging
import math
from bisect import bisect_left
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from itertools import islice
from operator import is_
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

if TYPE_CHECKING:
    import torch

from gradwatch.encoding import at_float32_precision, implied_drift, is_float32
from gradwatch.probe.facts import (
    Hits,
    JudgedStep,
    Norms,
    NormSample,
    ResetFact,
    ResetLoss,
    SiteFacts,
    StepFacts,
    StepTally,
    TextbookStep,
    as_left,
    param_indices,
)
from gradwatch.probe.losses import LoggedScalars, Value
from gradwatch.wire import Reset, Scalars, Step, StepSites, trusted

log = logging.getLogger("gradwatch.probe")

_NOTHING_LOST = ResetLoss()
_NO_LOSSES: dict[str, ResetLoss] = {}
_NO_PARAMS: frozenset[int] = frozenset()
_MAX_SITES = 64
"""Site ids a step names per role at most (the wire's bound)."""


class Lookup:
    """:func:`~gradwatch.probe.facts.param_indices` for one optimizer, with a memo of the last
    list looked up (and of the sorted parameters of a reset that cleared it)."""

    # The textbook loop's hooks append the same parameters in the same order every step:
    # checking a list against the last one by identity is cheaper than looking each up.
    __slots__ = ("index", "_last", "_looked_up", "_ordered")

    def __init__(self, index: dict[int, int]) -> None:
        self.index = index
        self._last: Hits = []
        self._looked_up: list[int] = []
        self._ordered: list[int] | None = None

    def params(self, hits: Hits) -> list[int]:
        """The parameter indices of ``hits`` (an index list as it is)."""
        if not as_left(hits):
            return hits
        last = self._last
        if len(hits) != len(last) or not all(map(is_, islice(hits, 1, None),
                                                 islice(last, 1, None))):
            self._looked_up = param_indices(hits, self.index)
            self._last = hits
            self._ordered = None
        return self._looked_up

    def reset_params(self, parts: list[tuple[Sequence[int], Sequence[Hits]]]) -> list[int]:
        """The sorted indices of the parameters that resets of one kind covered, each reset
        given as ``(its parameters, the hit lists it cleared)``; a new list."""
        if len(parts) == 1 and not parts[0][0] and len(parts[0][1]) == 1:
            # The textbook reset: one zero_grad clearing one step's list as the hooks left it.
            looked_up = self.params(parts[0][1][0])
            if looked_up is self._looked_up:
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


Item = StepFacts | BaseModel | LoggedScalars
"""What the writer is handed: step facts, or a wire record made already."""


class StepRecords:
    """Turns handed-over items into wire records: step facts into :class:`Step` records,
    wire records (already made) numbered as they are. One per writer."""

    def __init__(self) -> None:
        self._lookups: dict[str, Lookup] = {}
        """Optimizer name -> its lookup (names are unique within a watch session)."""

    def numbered(self, item: Item, seq: int) -> BaseModel:
        """``item`` as the record numbered ``seq``."""
        if isinstance(item, TextbookStep):
            return self._textbook(item, seq)
        if isinstance(item, JudgedStep):
            return step_record(seq, item.t, item.opt, item.step, item.skipped, item.tally,
                               item.resets, self._lookup(item.opt, item.index), item.losses,
                               item.late, item.discarded_params, item.sites,
                               loss_of(item.roots), item.lr)
        if isinstance(item, LoggedScalars):
            return trusted(Scalars, {"seq": seq, "t": item.t, "type": "scalars",
                                     "step": item.step, "opt": item.opt,
                                     "values": {k: _read(v) for k, v in item.values.items()}})
        item.seq = seq  # type: ignore[attr-defined]
        return item

    def _textbook(self, facts: TextbookStep, seq: int) -> Step:
        # One backward, every contribution fresh and consumed, nothing stale, leaked, late
        # or discarded (what makes it textbook): no tally to gather, most fields default.
        consumed = len(facts.hits) - 1
        resets, _ = _resets(facts.resets, self._lookup(facts.opt, facts.index), _NO_LOSSES)
        return _step(seq, facts.t, facts.opt, facts.step, resets, facts.norms,
                     loss_of(facts.roots), facts.lr, consumed=consumed, fresh=consumed)

    def _lookup(self, opt: str, index: dict[int, int]) -> Lookup:
        lookup = self._lookups.get(opt)
        if lookup is None:
            lookup = self._lookups[opt] = Lookup(index)
        return lookup


def step_record(seq: int, t: float, opt: str, step: int, skipped: bool, tally: StepTally,
                resets_since: list[ResetFact], lookup: Lookup, losses: dict[str, ResetLoss],
                late: AbstractSet[int], discarded_params: AbstractSet[int],
                sites: SiteFacts | None = None, root_loss: float | None = None,
                lr: list[float] | None = None) -> Step:
    """A :class:`Step` record from a step's facts."""
    resets, discarded = _resets(resets_since, lookup, losses)
    return _step(seq, t, opt, step, resets, tally.norms, root_loss, lr, skipped=skipped,
                 closure_evals=tally.closure_evals, backwards=len(tally.bws),
                 consumed=tally.consumed, fresh=tally.fresh, stale=tally.stale,
                 leaked=tally.leaked, stale_params=tally.stale_params,
                 leaked_params=tally.leaked_params, late=late, discarded=discarded,
                 discarded_params=discarded_params, sites=sites)


def _resets(resets_since: list[ResetFact], lookup: Lookup, losses: dict[str, ResetLoss]
            ) -> tuple[list[Reset], int]:
    """A step's :class:`Reset` entries, one per kind of reset since the previous step, and
    the contributions they threw away in all."""
    by_how: dict[str, list[tuple[Sequence[int], Sequence[Hits]]]] = {}
    last_site: dict[str, int] = {}
    for reset in resets_since:
        by_how.setdefault(reset.how, []).append((reset.params, reset.cleared))
        if reset.site:
            last_site[reset.how] = reset.site
    resets = []
    discarded = 0
    for how, parts in by_how.items():
        loss = losses.get(how, _NOTHING_LOST)
        discarded += loss.discarded
        resets.append(trusted(Reset, {"how": how, "params": lookup.reset_params(parts),
                                      "discarded": loss.discarded,
                                      "after_backward": loss.after_backward,
                                      "site": loss.site or last_site.get(how)}))
    return resets, discarded


def _step(seq: int, t: float, opt: str, step: int, resets: list[Reset], norms: Norms,
          root_loss: float | None, lr: list[float] | None, *, skipped: bool = False,
          closure_evals: int = 0, backwards: int = 1, consumed: int = 0, fresh: int = 0,
          stale: int = 0, leaked: int = 0, stale_params: AbstractSet[int] = _NO_PARAMS,
          leaked_params: AbstractSet[int] = _NO_PARAMS, late: AbstractSet[int] = _NO_PARAMS,
          discarded: int = 0, discarded_params: AbstractSet[int] = _NO_PARAMS,
          sites: SiteFacts | None = None) -> Step:
    """The one place a :class:`Step` record is made (the writer thread makes one per
    optimizer step: index sets are sorted only when not empty)."""
    norm = fresh_norm = drift = per = fresh_per = None
    if norms is not None:
        per, fresh_per, norm, fresh_norm = host_norms(norms)
        drift = implied_drift(norm, fresh_norm)  # the rule writers leave drift out by
    if root_loss is not None and is_float32([root_loss]):  # a float32 loss: 9 digits
        root_loss = at_float32_precision(root_loss)
    return trusted(Step, {
        "seq": seq, "t": t, "type": "step", "opt": opt, "step": step,
        "skipped": skipped, "closure_evals": closure_evals,
        "backwards": backwards, "consumed": consumed, "fresh": fresh,
        "stale": stale, "leaked": leaked,
        "stale_params": sorted(stale_params) if stale_params else [],
        "leaked_params": sorted(leaked_params) if leaked_params else [],
        "late_params": sorted(late) if late else [],
        "discarded": discarded,
        "discarded_params": sorted(discarded_params) if discarded_params else [],
        "resets": resets, "norm": norm, "fresh_norm": fresh_norm, "drift": drift,
        "param_norms": per, "param_fresh_norms": fresh_per,
        "sites": None if sites is None else trusted(StepSites, {
            "step": sites.step or None, "stale": sorted(sites.stale)[:_MAX_SITES],
            "leaked": sorted(sites.leaked)[:_MAX_SITES],
            "lost": sorted(sites.lost)[:_MAX_SITES],
            "fresh": sorted(sites.fresh)[:_MAX_SITES], "reset": sites.reset or None}),
        "loss": root_loss, "lr": lr})


def loss_of(roots: list[Value] | None) -> float | None:
    """The sum of a step's root values (:mod:`gradwatch.probe.losses`), read on the host:
    a CUDA value once its copy's event completed (this thread waits; the training thread
    never does). None when unknown or unreadable."""
    if roots is None:
        return None
    if len(roots) == 1 and type(v := roots[0]) is float:  # a step's one CPU loss
        return v
    total = 0.0
    try:
        for v in roots:
            total += _read(v)
    except Exception:  # noqa: BLE001 - a value that cannot be read: unknown, not an error
        log.debug("cannot read a loss value", exc_info=True)
        return None
    return total


def _read(v: Value) -> float:
    """A value on the host: as it is, or once its device copy's event completed."""
    if type(v) is float:
        return v
    v.event.synchronize()  # type: ignore[union-attr]
    return float(v.host.item())  # type: ignore[union-attr]


def host_norms(sample: NormSample | list[float]
               ) -> tuple[list[float | None], list[float | None], float, float | None]:
    """``(norms, fresh_norms, norm, fresh_norm)`` on the host, ``None`` where unknown. A list
    is the usual CPU step's read: every parameter, all of it fresh."""
    if isinstance(sample, list):
        total = _total(sample)
        return sample, sample, total, total  # type: ignore[return-value]
    nv = _listed(sample.norms)
    same = sample.fresh is sample.norms
    fv = nv if same else _listed(sample.fresh)
    total = _total(nv)
    ft = None if sample.unknown else (total if same else _total(fv))
    if len(sample.ks) == sample.n_params and not sample.unknown:
        return nv, fv, total, ft
    per: list[float | None] = [None] * sample.n_params
    fresh: list[float | None] = [None] * sample.n_params
    for j, k in enumerate(sample.ks):
        per[k] = nv[j]
        fresh[k] = fv[j]
    for j in sample.unknown:
        fresh[sample.ks[j]] = None
    return per, fresh, total, ft


def _listed(x: torch.Tensor | list[float]) -> list[Any]:
    """Host values: read from the device (GPU), or already read (CPU)."""
    return x if isinstance(x, list) else x.tolist()


def _total(xs: list[float]) -> float:
    """Norm of all parameters together: NaN where one is NaN (as the norm of the whole
    gradient would be), else Inf where one is Inf. To float32's precision when every part
    is a float32 (:func:`gradwatch.encoding.at_float32_precision`): the parts carry no
    more, and a log then holds 9 digits of it, not 17."""
    total = math.hypot(*xs)
    if total == math.inf and any(x != x for x in xs):
        return math.nan
    return at_float32_precision(total) if is_float32(xs) else total
