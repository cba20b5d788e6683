"""The per-step verdict: which contributions a step consumed, and what the resets threw away.

``consume`` runs when the optimizer reads its gradients (step entry, or after each closure
evaluation); ``finalize`` runs after the step and turns the facts into a pending
:class:`~gradwatch.wire.Step` record, whose norms the writer thread copies to the host.

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
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gradwatch.probe import norms as _norms
from gradwatch.probe.state import OptState, StepAcc

from gradwatch.wire import Reset, Step

if TYPE_CHECKING:
    from gradwatch.probe.tracker import Tracker

_PRUNE_AT = 50_000
_KEEP = 20_000


def consume(tr: Tracker, st: OptState, closure: bool = False) -> None:
    """Count what the optimizer reads now; mark it consumed."""
    params = st.params
    grads = [p.grad for p in params]
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
        nw.clear()
    if suspicious:
        vals = _norms.values([g for k in suspicious if (g := grads[k]) is not None])
        for k, v in zip(suspicious, vals, strict=False):
            zero.append(k)
            if v == 0.0:
                st.reset(k, "zero_")  # p.grad.data.zero_() outside zero_grad
            else:  # an untouched parameter still carrying a consumed gradient
                acc.stale += old[k]
                acc.stale_params.add(k)
                acc.consumed += old[k]
    if acc.stale:
        st.shown_stale = True
    every = tr.norms_every
    if every and st.step % every == 0:
        acc.norms = _norms.sample(grads, getattr(st.opt, "grad_scale", None), zero, mixed,
                                  st.baseline)
    if st.shown_stale and every and (st.step + 1) % every == 0:
        st.baseline = _norms.snapshot(grads)
    elif st.baseline is not None:
        st.baseline = None
    st.observe(grads)
    st.armed = True
    st.pre_check = None
    tr.armed.add(st)
    if closure:
        acc.closure_evals += 1


def observe_skip(tr: Tracker, st: OptState) -> None:
    """A GradScaler-skipped step looked at the gradients without applying them."""
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


@dataclass
class PendingStep:
    """A step record whose norms may still be on the device."""

    step: Step
    norms: _norms.NormSample | None

    def to_record(self, seq: int) -> Step:
        """The finished record (host copy of the norms happens here, in the writer)."""
        s = self.step
        s.seq = seq
        if self.norms is not None:
            per, fresh, known = self.norms.host()
            s.param_norms = per
            s.param_fresh_norms = fresh
            s.norm = _total(per)
            s.fresh_norm = _total(fresh) if known else None
            if s.norm is not None and s.fresh_norm:  # undefined when nothing fresh
                s.drift = s.norm / s.fresh_norm
        return s


def _total(xs: list[float | None]) -> float:
    """Norm of all parameters together (those with a gradient); NaN and Inf propagate."""
    return float(sum(x * x for x in xs if x is not None) ** 0.5)


def finalize(tr: Tracker, st: OptState, skipped: bool) -> PendingStep:
    """Judge the resets since the previous step and build the step record."""
    acc = st.acc
    first, observed = tr.first, tr.observed
    uid = st.uid
    late: set[int] = set()
    discarded = 0
    discarded_params: set[int] = set()
    by_how: dict[str, list[Any]] = {}
    for how, k, removed in st.pending:
        e = by_how.setdefault(how, [set(), 0, False])
        if k >= 0:
            e[0].add(k)
        if skipped or not removed:
            continue
        # Lost for this optimizer: no other optimizer's step consumed that backward and
        # no skipped step looked at it (the DCGAN pattern clears G's backward from D).
        wasted = [b for b in removed
                  if b not in observed and first.get(b, (uid,))[0] == uid]
        if not wasted:
            continue
        if k in acc.fresh_params:
            discarded += len(wasted)
            discarded_params.add(k)
            e[1] += len(wasted)
        else:
            late.add(k)
            e[2] = True
    resets = [Reset(how=how, params=sorted(e[0]), discarded=e[1],  # type: ignore[arg-type]
                    after_backward=e[2]) for how, e in by_how.items()]
    step = Step(
        seq=0, t=time.time(), opt=st.name, step=st.step, skipped=skipped,
        closure_evals=acc.closure_evals, backwards=len(acc.bws), consumed=acc.consumed,
        fresh=acc.fresh, stale=acc.stale, leaked=acc.leaked,
        stale_params=sorted(acc.stale_params), leaked_params=sorted(acc.leaked_params),
        late_params=sorted(late), discarded=discarded,
        discarded_params=sorted(discarded_params), resets=resets,
    )
    pending = PendingStep(step, acc.norms)
    st.pending = []
    st.acc = StepAcc()
    st.step += 1
    st.in_step = False
    tr.stepped_since_bw = True
    if len(first) > _PRUNE_AT:
        cut = tr.bw - _KEEP
        tr.first = {b: v for b, v in first.items() if b >= cut}
        tr.observed = {b for b in observed if b >= cut}
    return pending
