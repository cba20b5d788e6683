"""The per-step verdict: which contributions a step consumed, and what the resets threw away.

``consume`` runs when the optimizer reads its gradients (step entry, or after each closure
evaluation); ``finalize`` then judges the resets and hands the facts over as a
:class:`PendingStep` (right after ``consume`` for a step without a closure, after the step
for a closure step), which the writer thread turns into a :class:`~gradwatch.wire.Step`
record, copying the norms to the host.

Rules (see ``Step`` in :mod:`gradwatch.wire` for the fields):

- *stale*: a contribution this optimizer already consumed at an earlier step.
- *leaked*: a contribution from a backward that another optimizer's step consumed in an
  earlier phase (a phase ends when a backward starts after a step).
- *late*: a parameter with no fresh contribution at this step, whose contribution a reset
  removed, unconsumed, since the previous step.
- *discarded*: such removed contributions on parameters that then got a fresh one (a reset
  inside an accumulation window).

A removed contribution counts only when it is lost to this optimizer: its backward was not
consumed by *another* optimizer's step (DCGAN: G's backward fills D's grads and D's next
zero_grad clears them, fine) and no GradScaler-skipped step looked at it (the next reset
after a skipped step throws away non-finite gradients on purpose).

Cost: the usual step (every gradient reset by zero_grad since it was last consumed) takes
a bulk path that counts the hooks' hit list without touching parameters one by one:
:func:`_usual_step`, the whole step in one pass, after one backward (the hooks' list taken
whole, its parameters looked up by the writer thread); :func:`_consume_fast` after
several. Only a gradient still holding consumed content, a missing gradient
that had a contribution, a leak, or the armed path (hand-written resets) folds the hits per
parameter (:func:`_consume_slow`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from itertools import repeat
from operator import is_, itemgetter
from typing import TYPE_CHECKING, Any

from gradwatch.probe import norms as _norms
from gradwatch.probe.cpuplan import CpuPlan
from gradwatch.probe.state import Lookup, OptState, PendingReset, StepAcc
from gradwatch.wire import Reset, Step, trusted

if TYPE_CHECKING:
    from gradwatch.probe.tracker import Tracker

_PRUNE_AT = 50_000
_KEEP = 20_000


def consume(tr: Tracker, st: OptState, closure: bool = False) -> None:
    """Count what the optimizer reads now; mark it consumed."""
    st.pull()
    grads = [p.grad for p in st.params]
    any_missing = any(map(is_, grads, repeat(None)))
    fast = not (st.dirty or st.lazy_old or st.armed_bws)
    if fast and any_missing:  # a gradient gone since its contribution: per parameter
        fast = {k for k, g in enumerate(grads) if g is None}.isdisjoint(st.hits)
    zero: list[int] = []
    mixed: list[tuple[int, int]] = []
    if not (fast and _consume_fast(tr, st)):
        zero, mixed = _consume_slow(tr, st, grads)
        if st.acc.stale:
            st.shown_stale = True
    _sample_and_mark(tr, st, grads, zero, mixed, any_missing)
    if closure:
        st.acc.closure_evals += 1


def _sample_and_mark(tr: Tracker, st: OptState, grads: list[Any], zero: list[int],
                     mixed: list[tuple[int, int]], missing: bool) -> None:
    """After counting: sample the norms when due, and mark the gradients consumed."""
    norms = _due_norms(tr, st, grads, zero, mixed, missing)
    if norms is not None:
        st.acc.norms = norms
    _mark(tr, st, grads)


def _due_norms(tr: Tracker, st: OptState, grads: list[Any], zero: list[int],
               mixed: list[tuple[int, int]], missing: bool) -> Any:
    """This step's norms when due (host floats or a NormSample), else None; keeps the
    copy of the gradients the next step's exact fresh norms need (bug path)."""
    every = tr.norms_every
    if not every:
        return None
    step = st.step
    norms = None
    if step % every == 0:
        plan = st.norm_plan
        if plan is False and not missing:
            plan = st.norm_plan = CpuPlan.make(grads)
        scale = getattr(st.opt, "grad_scale", None)
        # The usual CPU step, all fresh, read at once; groups go through ``sample``,
        # whose grad mode is off (their ``out=`` buffers refuse a create_graph grad).
        if not (plan and not (plan.groups or plan.failed or missing or zero or mixed)
                and scale is None and (norms := plan.read(grads)) is not None):
            norms = _norms.sample(grads, scale, zero, mixed, st.baseline, missing,
                                  plan or None)
    if st.shown_stale and (step + 1) % every == 0:
        st.baseline = _norms.snapshot(grads)
    elif st.baseline is not None:
        st.baseline = None
    return norms


def _mark(tr: Tracker, st: OptState, grads: list[Any]) -> None:
    """The step read ``grads``: their content is consumed from now on."""
    st.last_grads = grads  # identity and versions taken lazily, if ever needed
    st.refs_ready = False
    st.armed = True
    st.pre_check = None
    tr.armed.add(st)


def plain_step(tr: Tracker, st: OptState) -> PendingStep | UsualStep:
    """A step without a closure: :func:`consume`, then :func:`finalize`.

    A step with every gradient reset since it was last consumed and none gone, and no reset
    that threw contributions away, is counted in bulk and has no reset to judge, so it
    skips the per-parameter checks of ``consume`` and the judging loop of ``finalize``:
    :func:`_usual_step` when one backward filled the gradients (the textbook loop; its
    hooks' list is taken whole, with no lookup of the parameters, see
    :func:`~gradwatch.probe.state.param_indices`), :func:`_consume_fast` when several did
    (accumulation).
    """
    if not (st.dirty or st.lazy_old or st.armed_bws or any(map(_removed, st.pending))):
        grads = [p.grad for p in st.params]
        if not any(map(is_, grads, repeat(None))):
            raw = st.incoming
            if len(raw) > 1 and type(h0 := raw[0]) is int and h0 == -tr.bw and not st.hits:
                # The textbook step: the hooks' list holds the last backward's marker, then
                # its contributions. Taken as it is (the writer looks the parameters up).
                if _claim(tr, st, (-h0,)):
                    hits = raw.copy()
                    raw.clear()  # in place: the hooks hold its append
                    st.cur_bw = -h0
                    st.lazy_old.append(hits)
                    return _usual_step(tr, st, grads, hits)
            else:
                st.pull()
                if _consume_fast(tr, st):
                    _sample_and_mark(tr, st, grads, [], [], False)
                    return _close_step(tr, st, PendingStep(st, False, _NO_JUDGED, _NO_PARAMS,
                                                           _NO_PARAMS))
    consume(tr, st)
    return finalize(tr, st, skipped=False)


def _usual_step(tr: Tracker, st: OptState, grads: list[Any], hits: list[Any]) -> UsualStep:
    """The textbook step, its hits taken: one backward marker, then its contributions. The
    whole step in one pass, with no per-step accumulator (the writer thread builds it)."""
    usual = UsualStep(st, hits, _due_norms(tr, st, grads, [], [], False))
    _mark(tr, st, grads)
    _advance(tr, st)
    return usual


_removed = itemgetter(2)
"""A pending reset's ``[(param, removed backward ids)]``."""
_NO_JUDGED: dict[str, list[Any]] = {}
_NO_PARAMS: frozenset[int] = frozenset()
"""Shared, never written: what a step with no reset to judge hands over."""


def _consume_fast(tr: Tracker, st: OptState) -> bool:
    """No gradient holds consumed content: counts the hits (pulled) in bulk into the step's
    accumulator, after any number of backwards, and keeps them for the next reset. Returns
    False, changing nothing, when a contribution leaked from another optimizer's earlier
    phase (counted per parameter)."""
    hits = st.hits
    n = len(hits)
    if n and (h0 := hits[0]) < 0 and min(hits) == h0:
        # One backward since the last consumption (markers only decrease): no scan.
        marks = [0]
        bws = [-h0] if n > 1 else []
    else:
        marks = [j for j, h in enumerate(hits) if h < 0]
        bws = [-hits[j] for j in marks if j + 1 < n and hits[j + 1] >= 0]
        if n and hits[0] >= 0:
            bws.append(st.cur_bw)
    if not _claim(tr, st, bws):
        return False
    if marks:
        st.cur_bw = -hits[marks[-1]]
    st.hits = []
    st.lazy_old.append(hits)
    total = n - len(marks)
    acc = st.acc
    acc.fresh += total
    acc.consumed += total
    acc.bws.update(bws)
    acc.fresh_hits.append(hits)
    return True


def _claim(tr: Tracker, st: OptState, bws: Iterable[int]) -> bool:
    """Record ``st``'s step as the first consumer of backwards ``bws``. False, recording
    nothing, when one of them leaked: another optimizer's step consumed it in an earlier
    phase. With one optimizer nothing can leak and nothing is recorded (an optimizer
    attached later never holds contributions from backwards before its attach)."""
    if len(tr.by_opt) < 2:
        return True
    first, phase, uid = tr.first, tr.phase, st.uid
    for b in bws:
        c = first.get(b)
        if c is not None and c[0] != uid and c[1] < phase:
            return False
    for b in bws:
        first.setdefault(b, (uid, phase))
    return True


def _consume_slow(tr: Tracker, st: OptState, grads: list[Any]) -> tuple[list[int],
                                                                       list[tuple[int, int]]]:
    """Some gradient still holds consumed content (or lost its fresh one): per parameter."""
    st.sync()
    st.sync_old()
    st.dirty = True
    st.ensure_observed()
    old, new, refs = st.old, st.new, st.refs
    acc = st.acc
    first = tr.first
    phase = tr.phase
    uid = st.uid
    suspicious: list[int] = []
    zero: list[int] = []
    mixed: list[tuple[int, int]] = []
    for k, g in enumerate(grads):
        nw = new[k]
        o = old[k]
        if g is None:
            if nw or o:
                st.reset(k, "set_none")  # p.grad = None outside zero_grad
            continue
        if not nw:
            if o:
                r = refs[k]
                cur = r() if r is not None else None
                if cur is g:
                    suspicious.append(k)  # still the consumed gradient, or zeroed?
                else:
                    st.reset(k, "set_none" if cur is None else "replaced")
                    zero.append(k)
            else:
                zero.append(k)
            continue
        if o:
            acc.stale += o
            acc.stale_params.add(k)
            mixed.append((k, len(nw)))
        for b in nw:
            c = first.get(b)
            if c is None:
                first[b] = (uid, phase)
                acc.fresh += 1
            elif c[0] != uid and c[1] < phase:
                acc.leaked += 1
                acc.leaked_params.add(k)
            else:
                acc.fresh += 1
        acc.bws.update(nw)
        acc.fresh_params.add(k)
        acc.consumed += o + len(nw)
        old[k] = o + len(nw)
        new[k] = []
    if suspicious:
        vals = _norms.values([g for k in suspicious if (g := grads[k]) is not None])
        for k, v in zip(suspicious, vals, strict=True):
            zero.append(k)
            if v == 0.0:
                st.reset(k, "zero_")  # p.grad.data.zero_() outside zero_grad
            else:  # an untouched parameter still carrying a consumed gradient
                acc.stale += old[k]
                acc.stale_params.add(k)
                acc.consumed += old[k]
    return zero, mixed


def observe_skip(tr: Tracker, st: OptState) -> None:
    """A GradScaler-skipped step looked at the gradients without applying them."""
    st.sync()
    grads = [p.grad for p in st.params]
    acc = st.acc
    for k, g in enumerate(grads):
        nw = st.new[k]
        if g is not None and nw:
            tr.observed.update(nw)
            acc.bws.update(nw)
    every = tr.norms_every
    if every and st.step % every == 0:
        acc.norms = _norms.sample(grads, None, [], [], None)


class UsualStep:
    """The facts of a step that :func:`_usual_step` took in one pass: its hits (one
    backward marker, then its contributions: the parameters as the hooks appended them),
    the resets since the previous step (none judged: nothing they removed was lost) and
    the norms. The writer thread turns them into a :class:`Step` record."""

    __slots__ = ("t", "opt", "step", "resets", "lookup", "hits", "norms")

    def __init__(self, st: OptState, hits: list[Any], norms: Any) -> None:
        self.t = time.time()
        self.opt = st.name
        self.step = st.step
        self.resets = st.pending
        self.lookup = st.lookup
        self.hits = hits
        self.norms = norms

    def to_record(self, seq: int) -> Step:
        """The finished record, the same as :class:`PendingStep` would build."""
        acc = StepAcc()
        acc.fresh = acc.consumed = len(self.hits) - 1
        acc.bws.add(-self.hits[0])
        acc.norms = self.norms
        return _record(seq, self.t, self.opt, self.step, False, acc, self.resets, self.lookup,
                       _NO_JUDGED, _NO_PARAMS, _NO_PARAMS)


class PendingStep:
    """A step's facts, turned into a :class:`Step` record by the writer thread.

    The training thread only judges the resets (``judged``); building the record (index
    sets, reset summaries, host copies of device norms) is the writer thread's work.
    """

    __slots__ = ("t", "opt", "step", "skipped", "acc", "resets", "lookup", "judged", "late",
                 "discarded_params")

    def __init__(self, st: OptState, skipped: bool, judged: dict[str, list[Any]],
                 late: AbstractSet[int], discarded_params: AbstractSet[int]) -> None:
        self.t = time.time()
        self.opt = st.name
        self.step = st.step
        self.skipped = skipped
        self.acc = st.acc
        self.resets = st.pending
        self.lookup = st.lookup
        self.judged = judged
        """``how -> [contributions discarded, removed after a backward (late)]``."""
        self.late = late
        self.discarded_params = discarded_params

    def to_record(self, seq: int) -> Step:
        """The finished record (device norms are copied to the host here, in the writer)."""
        return _record(seq, self.t, self.opt, self.step, self.skipped, self.acc, self.resets,
                       self.lookup, self.judged, self.late, self.discarded_params)


def _record(seq: int, t: float, opt: str, step: int, skipped: bool, acc: StepAcc,
            resets_since: list[PendingReset], lookup: Lookup,
            judged: dict[str, list[Any]], late: AbstractSet[int],
            discarded_params: AbstractSet[int]) -> Step:
    """A :class:`Step` record from a step's facts (in the writer thread)."""
    by_how: dict[str, list[tuple[Sequence[int], Sequence[list[Any]]]]] = {}
    for how, ks, _, hit_lists in resets_since:
        by_how.setdefault(how, []).append((ks, hit_lists))
    resets = []
    discarded = 0
    for how, parts in by_how.items():
        d, after = judged.get(how, (0, False))
        discarded += d
        resets.append(trusted(Reset, {"how": how, "params": lookup.reset_params(parts),
                                      "discarded": d, "after_backward": after}))
    norm = fresh_norm = drift = per = fresh = None
    if acc.norms is not None:
        per, fresh, norm, fresh_norm = _norms.on_host(acc.norms)
        if norm is not None and fresh_norm:  # undefined when nothing fresh
            drift = norm / fresh_norm
    return trusted(Step, {
        "seq": seq, "t": t, "type": "step", "opt": opt, "step": step,
        "skipped": skipped, "closure_evals": acc.closure_evals,
        "backwards": len(acc.bws), "consumed": acc.consumed, "fresh": acc.fresh,
        "stale": acc.stale, "leaked": acc.leaked,
        "stale_params": sorted(acc.stale_params),
        "leaked_params": sorted(acc.leaked_params), "late_params": sorted(late),
        "discarded": discarded, "discarded_params": sorted(discarded_params),
        "resets": resets, "norm": norm, "fresh_norm": fresh_norm, "drift": drift,
        "param_norms": per, "param_fresh_norms": fresh})


def finalize(tr: Tracker, st: OptState, skipped: bool) -> PendingStep:
    """Judge the resets since the previous step; hand the step's facts to the writer."""
    judged: dict[str, list[Any]] = {}
    late: set[int] = set()
    discarded_params: set[int] = set()
    if not skipped:
        acc = st.acc
        first, observed = tr.first, tr.observed
        uid = st.uid
        for how, _, removed, _ in st.pending:
            for k, bws in removed:
                # Lost for this optimizer: no other optimizer's step consumed that backward
                # and no skipped step looked at it (DCGAN: D's zero_grad clears G's backward).
                wasted = [b for b in bws
                          if b not in observed and first.get(b, (uid,))[0] == uid]
                if not wasted:
                    continue
                e = judged.setdefault(how, [0, False])
                if acc.had_fresh(k):
                    e[0] += len(wasted)
                    discarded_params.add(k)
                else:
                    late.add(k)
                    e[1] = True
    return _close_step(tr, st, PendingStep(st, skipped, judged, late, discarded_params))


def _close_step(tr: Tracker, st: OptState, pending: PendingStep) -> PendingStep:
    """Start the optimizer's next step with a new accumulator."""
    st.acc = StepAcc()
    _advance(tr, st)
    return pending


def _advance(tr: Tracker, st: OptState) -> None:
    """Start the optimizer's next step; forget backwards too old to matter.

    The accumulator is the caller's: :func:`_usual_step` never wrote to it.
    """
    st.pending = []
    st.step += 1
    st.in_step = False
    tr.stepped_since_bw = True
    if len(tr.first) > _PRUNE_AT:
        cut = tr.bw - _KEEP
        tr.first = {b: v for b, v in tr.first.items() if b >= cut}
        tr.observed = {b for b in tr.observed if b >= cut}
