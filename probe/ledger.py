"""One optimizer's step accounting: what each step consumed, and what the resets threw away.

Thread: training (the tracker routes the step hooks, the closure and zero_grad wrappers and
the backward wrapper here).

A ledger counts each step of its optimizer from the contributions its gradients hold
(:mod:`gradwatch.probe.contributions`), judges the resets since the previous step, and hands
the step's facts over for the writer thread (:mod:`gradwatch.probe.facts`). Rules (fields:
``Step`` in :mod:`gradwatch.wire`):

- *stale*: a contribution this optimizer already consumed at an earlier step.
- *leaked*: a contribution from a backward that another optimizer's step consumed in an
  earlier phase (:mod:`gradwatch.probe.backwards`).
- *late*: a parameter with no fresh contribution at this step, whose contribution a reset
  removed, unconsumed and lost (:meth:`~gradwatch.probe.backwards.Backwards.lost`), since
  the previous step.
- *discarded*: such lost contributions on parameters that then got a fresh one (a reset
  inside an accumulation window).

Contributions thrown away on purpose (:mod:`gradwatch.probe.deliberate`) are neither.

Three ways count a step, all ending in the same facts (a test proves it): the textbook step
(one backward since the last step, every gradient reset since) takes the hooks' list whole;
any other step whose gradients hold no consumed content counts the hits in bulk; the rest
goes parameter by parameter.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from itertools import repeat
from operator import attrgetter, is_

import torch

from gradwatch.probe.backwards import Backwards
from gradwatch.probe.contributions import Contributions
from gradwatch.probe.deliberate import Deliberate
from gradwatch.probe.facts import (
    Hits,
    JudgedStep,
    ResetFact,
    ResetLoss,
    SiteFacts,
    StepFacts,
    StepTally,
    TextbookStep,
    param_indices,
)
from gradwatch.probe.handresets import ArmedBackward
from gradwatch.probe.norms import Grads, NormSchedule
from gradwatch.probe.shards import GradReader

_removed = attrgetter("removed")
_grad = attrgetter("grad")
_now = time.time
_NO_LOSSES: dict[str, ResetLoss] = {}
_NO_PARAMS: frozenset[int] = frozenset()
"""Shared, never written: what a step with no reset to judge hands over."""
_BY_HAND = frozenset({"set_none", "zero_", "replaced"})
_FIRST_WATCHED = 64
"""Backwards watched at most before an optimizer's first step or reset (it is armed from
attach so that a reset by hand before its first step is seen)."""
Lost = tuple[ResetFact, int, list[int]]
"""A reset, a parameter, and the backwards of the contributions on it the reset threw away."""


class Ledger:
    """Everything the probe counts for one optimizer, and the methods that count it."""

    __slots__ = ("opt", "uid", "name", "params", "groups", "backwards", "contents", "norms",
                 "step", "tally", "in_step", "deliberate", "reader", "reset_site")

    def __init__(self, opt: torch.optim.Optimizer, name: str, params: list[torch.Tensor],
                 groups: list[int], backwards: Backwards[Ledger], norms_every: int) -> None:
        self.opt = opt
        self.uid = backwards.join()
        self.name = name
        self.params = params
        """The optimizer's parameters, in a fixed order (parameters added later at the end)."""
        self.groups = groups
        """Each parameter's param group."""
        self.backwards = backwards
        self.reader = GradReader(params)
        """How its gradients are read (a DTensor's as its local shard): every part reads
        ``.grad`` through it."""
        self.contents = Contributions(params, backwards, self.reader)
        self.contents.judge = self._judge_removal
        self.norms = NormSchedule(opt, norms_every, self.reader)
        self.deliberate = Deliberate(params, self.reader)
        self.step = 0
        self.tally = StepTally()
        self.in_step = False
        """Inside a closure step (the step post-hook ends it)."""
        self.reset_site = 0
        """Where this optimizer's parameters were last reset by a call (0: never, or by
        hand): a step that re-applies old gradients names it, the reset in the wrong place
        (``zero_grad()`` once per epoch)."""
        # Armed until its first reset or step: a hand-written reset (``p.grad = None``)
        # before the first step is told from an accumulation like any later one.
        backwards.armed.add(self)

    @property
    def incoming(self) -> Hits:
        """The list each of its parameters' hooks appends to (its ``append`` is the hook)."""
        return self.contents.incoming

    # ---------------------------------------------------------------- parameters
    def add(self, params: list[torch.Tensor], groups: list[int]) -> range:
        """Parameters added to the optimizer (``add_param_group``), indexed after the others;
        returns their indices."""
        self.reader.saw(params)
        ks = self.contents.add(params)  # extends self.params: the same list
        self.groups.extend(groups)
        self.norms.replan()
        self.deliberate.replan()
        return ks

    def found(self, ks: range) -> None:
        """Parameters ``ks`` were just hooked: what their gradients hold is fresh."""
        self.contents.found(ks)

    # ---------------------------------------------------------------- torch's events
    def after_zero_grad(self, site: int = 0) -> None:
        """``Optimizer.zero_grad`` (called at ``site``) reset every parameter (inlined in
        :meth:`Tracker.opt_zero_grad`'s usual case: a change here goes there too)."""
        if self.norms.began:  # (else it holds no fresh part: nothing to throw away)
            self.norms.reset()
        self.contents.reset_all("optimizer_zero_grad", site)
        self.backwards.armed.discard(self)
        self.reset_site = site

    def after_module_zero_grad(self, ks: Sequence[int], site: int = 0,
                               how: str = "module_zero_grad") -> None:
        """``Module.zero_grad`` (or another optimizer's ``zero_grad``: ``how``) reset
        parameters ``ks`` of this optimizer."""
        if self.contents.reset_some(ks, how, site):
            self.norms.reset()
            self.backwards.armed.discard(self)
        if site:
            self.reset_site = site

    @property
    def on_phase(self) -> Callable[[], None]:
        """What to call when the first backward after a step (any optimizer's) starts: one
        bound callable, which the tracker keeps and calls with no frame of the ledger's own."""
        return self.deliberate.phase_began

    def backward_begins(self, bw: int) -> ArmedBackward | None:
        """Backward ``bw`` starts while this ledger is armed or lossy: an armed one takes the
        ``.grad`` state before it (returned, completed by :meth:`backward_ends`) and
        measures its fresh part."""
        if self not in self.backwards.armed:
            return None
        if self.step == 0 and len(self.contents.hand.backwards) >= _FIRST_WATCHED:
            # armed since attach and still no step nor reset (an optimizer not used yet):
            # stop watching, or the state of every backward would pile up (their hits
            # fold as plain contributions)
            self.backwards.armed.discard(self)
            self.contents.hand.backwards.clear()
            return None
        seen = self.contents.watch_backward(bw)
        self.norms.backward_begins(self.step, self.params, self.contents.old)
        return seen

    def backward_ends(self, seen: ArmedBackward | None) -> None:
        """The engine returned from a backward :meth:`backward_begins` saw start."""
        if seen is not None:
            seen.done(self.params)
            self.norms.backward_ends(self.params)
        if self in self.backwards.lossy:
            self.deliberate.backward_left()

    def fold_if_over(self, limit: int) -> None:
        """Fold the hooks' list when it holds more than ``limit`` entries (backwards with no
        step nor reset between them)."""
        if len(self.contents.incoming) > limit:
            self.contents.fold()

    def release(self) -> None:
        """The probe stopped: drop what the hooks appended."""
        self.contents.release()

    # ---------------------------------------------------------------- steps
    def plain_step(self) -> StepFacts:
        """A step without a closure, at its entry (it reads its gradients now and nothing
        after): count, judge, hand the facts over, start the next step.

        The usual step (every gradient reset since it was last consumed, none gone, no reset
        that lost anything) skips the per-parameter checks of :meth:`consume` and the judging
        of :meth:`finalize`.
        """
        contents = self.contents
        reader = self.reader
        # (GradReader.grads without its frame where no gradient is a DTensor)
        grads = reader.grads(self.params) if reader.sharded else list(map(_grad, self.params))
        took = contents.take_textbook(self.uid, grads)
        if took is not None:
            norms = self.norms
            facts = TextbookStep(_now(), self.name, self.step, took[1], contents.index,
                                 took[0], norms.due(self.step, grads, [], [], False)
                                 if norms.every else None)
            backwards = self.backwards
            # :meth:`_mark` (its ``consumed`` done by ``take_textbook``) and :meth:`_advance`,
            # inlined: no frame of their own on the usual step
            backwards.armed.add(self)
            self.step += 1
            self.in_step = False
            backwards.stepped = True
            # The step consumed its one backward whole: no reset can lose its contributions
            # now, so :meth:`Backwards.wrote_input_grad` never needs its roots again. Let
            # go of them (the loss and its graph's nodes): the user's ``loss`` variable
            # frees them where it would unwatched, not the next backward's island.
            backwards.roots = None
            if backwards.lossy and self in backwards.lossy:
                backwards.lossy.discard(self)
                self.deliberate.forget()
            return facts
        if contents.settled() and not any(map(_removed, contents.pending)) and not any(
                map(is_, grads, repeat(None))):
            contents.pull()
            if contents.take_bulk(self.uid, self.tally):
                self._sample_and_mark(grads, [], [], False)
                return self._close(False, _NO_LOSSES, _NO_PARAMS, _NO_PARAMS)
        self.consume(grads=grads)
        return self.finalize(skipped=False)

    def open_closure_step(self) -> None:
        """A closure step starts; :meth:`consume` follows each evaluation of its closure."""
        self.in_step = True

    def close_closure_step(self) -> JudgedStep | None:
        """The closure step ended: its facts (None outside a closure step)."""
        return self.finalize(skipped=False) if self.in_step else None

    def skipped_step(self) -> JudgedStep:
        """GradScaler skipped the step: it looked at the gradients without applying them."""
        grads = self.reader.grads(self.params)
        bws = self.contents.unconsumed(grads)
        self.backwards.observe(bws)
        self.tally.bws.update(bws)
        norms = self.norms.skipped(self.step, grads)
        if norms is not None:
            self.tally.norms = norms
        return self.finalize(skipped=True)

    def consume(self, closure: bool = False, grads: Grads | None = None) -> None:
        """The general way: count what the optimizer reads now (``grads``, when the caller
        read them already); mark it consumed."""
        contents = self.contents
        contents.pull()
        if grads is None:
            grads = self.reader.grads(self.params)
        missing = any(map(is_, grads, repeat(None)))
        zero: list[int] = []
        mixed: list[tuple[int, int]] = []
        if not (contents.bulk_countable(grads, missing)
                and contents.take_bulk(self.uid, self.tally)):
            zero, mixed = contents.take_each(grads, self.uid, self.tally)
            if self.tally.stale:
                self.norms.saw_stale()
        self._sample_and_mark(grads, zero, mixed, missing)
        if closure:
            self.tally.closure_evals += 1

    def finalize(self, skipped: bool) -> JudgedStep:
        """Judge the resets since the previous step (a skipped step's are not judged), hand
        the step's facts over and start the next step."""
        if skipped:
            return self._close(True, _NO_LOSSES, _NO_PARAMS, _NO_PARAMS)
        tally, lost, uid = self.tally, self.backwards.lost, self.uid
        late: list[Lost] = []
        discarded: list[Lost] = []
        for reset in self.contents.pending:
            if reset.how in _BY_HAND:
                self.norms.quiet = True
            if reset.used:
                continue
            for k, bws in reset.removed:
                gone = lost(uid, bws)
                if gone:
                    (discarded if tally.had_fresh(k) else late).append((reset, k, gone))
        if discarded and self.backwards.through:
            discarded = self._not_surgery(discarded, late)
        deliberate = self.deliberate
        if (discarded or late) and deliberate.left is not None:
            grads = self.reader.grads(self.params)
            if deliberate.handwritten(grads, {k for _, k, _ in discarded + late}):
                # gradient surgery: the step read what was written after the backwards
                discarded = []
                late = [x for x in late if grads[x[1]] is None]
        if (late and all(r.how != "optimizer_zero_grad" for r, _, _ in late)
                and deliberate.frozen_layers({k for _, k, _ in late}, self._fresh_params())):
            late = []  # whole layers frozen for this step by hand, the rest stepped fresh
        losses: dict[str, ResetLoss] = {}
        lost_bws: set[int] = set()
        for found, is_late in ((late, True), (discarded, False)):
            for reset, _, gone in found:
                loss = losses.get(reset.how)
                if loss is None:
                    loss = losses[reset.how] = ResetLoss(site=reset.site)
                if is_late:
                    loss.after_backward = True
                else:
                    loss.discarded += len(gone)
                lost_bws.update(gone)
        facts = self._close(False, losses, {k for _, k, _ in late},
                            {k for _, k, _ in discarded})
        if facts.has_findings():
            site_of = self.backwards.site_of
            facts.sites = SiteFacts(0, tally.stale_sites,
                                    {s for b in tally.leaked_bws if (s := site_of(b))},
                                    {s for b in lost_bws if (s := site_of(b))},
                                    {s for b in tally.bws if (s := site_of(b))},
                                    self.reset_site if tally.stale else 0)
        return facts

    def _not_surgery(self, discarded: list[Lost], late: list[Lost]) -> list[Lost]:
        """``discarded`` without the losses of loss surgery through one retained graph: a
        reset that emptied only parameters refilled before the step (none of it ``late``),
        of contributions only from backwards whose retained graph the next one ran
        through."""
        through = self.backwards.through
        bad = {id(r) for r, _, _ in late}
        bad.update(id(r) for r, _, gone in discarded if not through.issuperset(gone))
        return [x for x in discarded if id(x[0]) in bad]

    def _fresh_params(self) -> set[int]:
        """The parameters that got a fresh contribution consumed at this step."""
        tally = self.tally
        fresh = set(tally.fresh_params)
        for hits in tally.fresh_hits:
            fresh.update(h for h in param_indices(hits, self.contents.index) if h >= 0)
        return fresh

    def _judge_removal(self, reset: ResetFact) -> ResetFact:
        """A reset removed contributions no step consumed: whether they were used on purpose
        (see :mod:`gradwatch.probe.deliberate`); if not, watch the gradients the next
        backwards leave, for the step to judge."""
        lost, uid = self.backwards.lost, self.uid
        gone = [(k, lost(uid, bws)) for k, bws in reset.removed]
        gone = [(k, bws) for k, bws in gone if bws]
        if not gone:  # another optimizer's step consumed them (a GAN's D.zero_grad)
            return reset
        if self.deliberate.moved({k for k, _ in gone}) or self.backwards.wrote_input_grad(
                {b for _, bws in gone for b in bws}):
            return reset._replace(used=True)
        self.backwards.lossy.add(self)
        return reset

    def _sample_and_mark(self, grads: Grads, zero: list[int],
                         mixed: list[tuple[int, int]], missing: bool) -> None:
        norms = self.norms.due(self.step, grads, zero, mixed, missing)
        if norms is not None:
            self.tally.norms = norms
        self._mark(grads)

    def _mark(self, grads: Grads) -> None:
        """The step read ``grads``: their content is consumed from now on. (The textbook
        step of :meth:`plain_step` does the same inline: change both.)"""
        self.contents.consumed(grads)
        self.backwards.armed.add(self)

    def _close(self, skipped: bool, losses: dict[str, ResetLoss], late: AbstractSet[int],
               discarded: AbstractSet[int]) -> JudgedStep:
        """The step's facts, handed over; the next step starts with a new tally."""
        facts = JudgedStep(time.time(), self.name, self.step, skipped, self.tally,
                           self.contents.take_resets(), self.contents.index, losses, late,
                           discarded)
        self.tally = StepTally()
        self._advance()
        return facts

    def _advance(self) -> None:
        """Start the next step (the tally is the caller's: a textbook step never wrote it).
        (The textbook step of :meth:`plain_step` does the same inline: change both.)"""
        self.step += 1
        self.in_step = False
        self.backwards.stepped = True
        lossy = self.backwards.lossy
        if lossy and self in lossy:
            lossy.discard(self)
            self.deliberate.forget()

