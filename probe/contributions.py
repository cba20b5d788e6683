"""What each parameter's ``.grad`` holds, in contributions, for one optimizer; and the resets
that removed some.

Thread: training (through the optimizer's ledger).

A *contribution* is one backward pass added into one ``.grad``. Per parameter this keeps how
many contributions in ``.grad`` the optimizer already consumed (``old``) and the backward ids
of those it has not (``new``). The hooks only append to ``incoming`` (see
:mod:`gradwatch.probe.facts`); that is turned into indices and folded into ``old`` and ``new``
only when a path needs them per parameter, so the usual step never touches them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any

import torch

from gradwatch.probe.backwards import Backwards
from gradwatch.probe.facts import Hits, ResetFact, StepTally, as_left, param_indices
from gradwatch.probe.handresets import ArmedBackward, HandResets
from gradwatch.probe.norms import Grads, values
from gradwatch.probe.shards import GradReader

_new_reset = partial(tuple.__new__, ResetFact)
"""``ResetFact`` from a tuple of all its fields, with no Python frame (its ``__new__`` is
one): the usual reset makes one per step."""
_MAX_PENDING = 4096
"""Resets kept for an optimizer's next step (see :meth:`Contributions._pend`)."""


class Contributions:
    """One optimizer's contributions, consumed and not, per parameter. Owned by its ledger."""

    __slots__ = ("params", "index", "backwards", "hand", "incoming", "hits", "cur_bw",
                 "lazy_old", "dirty", "old", "new", "pending", "old_sites", "judge", "reader")

    def __init__(self, params: list[torch.Tensor], backwards: Backwards[Any],
                 reader: GradReader) -> None:
        self.params = params
        self.reader = reader
        self.index = {id(p): k for k, p in enumerate(params)}
        """``id(param) -> k``: the parameters are held by :attr:`params`, so ids stay theirs."""
        self.backwards = backwards
        self.hand = HandResets(params, reader)
        n = len(params)
        self.incoming: Hits = []
        """What the hooks append (each parameter's hook is this list's ``append``, the
        backward wrapper appends ``-bw``). Never replaced: the hooks hold it."""
        self.hits: list[int] = []
        """:attr:`incoming` as indices (:meth:`pull`), not yet folded."""
        self.cur_bw = 0
        """The backward the last hit taken belongs to."""
        self.lazy_old: list[Hits] = []
        """Hit lists consumed in bulk, not yet added into :attr:`old`."""
        self.dirty = False
        """:attr:`old`/:attr:`new` may hold content (else they are all zero/empty)."""
        self.old: list[int] = [0] * n
        self.new: list[list[int]] = [[] for _ in range(n)]
        self.pending: list[ResetFact] = []
        """Resets since the last step."""
        self.old_sites: set[int] = set()
        """Sites of the backwards whose consumed contributions were folded into :attr:`old`
        since the last full reset (where re-applied content comes from)."""
        self.judge: Callable[[ResetFact], ResetFact] | None = None
        """Called on each reset that removed unconsumed contributions, as it is recorded: the
        fact to keep (the ledger marks a deliberate one)."""

    def add(self, params: list[torch.Tensor]) -> range:
        """Parameters added to the optimizer, indexed after the others: their indices."""
        n0, n = len(self.params), len(params)
        self.index.update((id(p), n0 + j) for j, p in enumerate(params))
        self.params.extend(params)
        self.old.extend([0] * n)
        self.new.extend([] for _ in range(n))
        self.hand.extend(self.reader.grads(params))
        return range(n0, n0 + n)

    def found(self, ks: Iterable[int]) -> None:
        """Parameters ``ks`` were just hooked: content their gradients already hold is fresh
        for the next step, never judged as discarded or late (its origin was not seen)."""
        bw = 0  # one backward for all the content found together, not one per parameter
        for k in ks:
            if self.params[k].grad is not None:
                bw = bw or self.backwards.found()
                self.new[k].append(bw)
                self.dirty = True

    # ---------------------------------------------------------------- hits
    def pull(self) -> None:
        """Append :attr:`incoming` to :attr:`hits` as indices (in bulk)."""
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

    def fold(self) -> None:
        """Fold the hits into the per-parameter :attr:`new` lists; contributions of an armed
        backward are judged as they land."""
        self.pull()
        if not self.hits:
            return
        hits, self.hits = self.hits, []
        self.fold_consumed()
        bw = self.cur_bw
        new = self.new
        armed = self.hand.backwards
        seen = armed.get(bw) if armed else None
        for h in hits:
            if h < 0:
                bw = -h
                seen = armed.get(bw) if armed else None
            elif seen is None:
                new[h].append(bw)
                self.dirty = True
            else:
                self._landed(h, bw, seen)
        self.cur_bw = bw
        if armed:
            self.hand.retire_done()

    def fold_consumed(self) -> None:
        """Add the bulk-consumed hits into the per-parameter :attr:`old` counts."""
        if not self.lazy_old:
            return
        old, index = self.old, self.index
        bws: set[int] = set()
        for hits in self.lazy_old:
            if as_left(hits):
                bws.add(-hits[0])
            bw = 0  # a backward counts once a contribution of its own follows its marker
            for h in param_indices(hits, index):
                if h >= 0:
                    old[h] += 1
                    self.dirty = True
                    if bw:
                        bws.add(bw)
                        bw = 0
                else:
                    bw = -h
        self.lazy_old = []
        self._consumed_from(bws)

    def _consumed_from(self, bws: Iterable[int]) -> None:
        """Contributions of backwards ``bws`` are consumed content from now on."""
        site_of = self.backwards.site_of
        self.old_sites.update(s for b in bws if (s := site_of(b)))

    def _landed(self, k: int, bw: int, seen: ArmedBackward) -> None:
        self.dirty = True
        how = self.hand.landed(k, bw, seen, self.old[k], bool(self.new[k]))
        if how is not None:
            self.reset(k, how)
        self.new[k].append(bw)

    def release(self) -> None:
        """The probe stopped: drop the hits waiting (the hooks may have appended more)."""
        self.incoming.clear()
        self.hits.clear()

    # ---------------------------------------------------------------- resets
    def reset(self, k: int, how: str, site: int = 0) -> None:
        """Parameter ``k``'s gradient content was removed by ``how`` (called at ``site``)."""
        self.fold()
        self.fold_consumed()
        removed = self.new[k]
        if removed:
            self.new[k] = []  # hand the list itself over; never share it
        self.old[k] = 0
        self._pend(ResetFact(how, [k], [(k, removed)] if removed else [], (), site))

    def reset_all(self, how: str, site: int = 0) -> None:
        """Every parameter was reset: in bulk where possible (the usual reset hands the
        consumed hit lists over as they are). Nothing to compare with any more."""
        if self.incoming or self.hits:
            self.fold()
        lazy, self.lazy_old = self.lazy_old, []
        hand = self.hand  # (HandResets.forget, inlined: nothing to compare with any more)
        hand.held, hand.ready = None, True
        if self.old_sites:
            self.old_sites = set()
        if not self.dirty:  # the usual reset, once a step: it removed nothing to judge
            pending = self.pending
            pending.append(_new_reset((how, (), (), lazy, site, False)))
            if len(pending) > _MAX_PENDING:
                self._pend(pending.pop())  # (trims as :meth:`_pend` does)
            return
        old, new = self.old, self.new
        ks = [k for k, (o, nw) in enumerate(zip(old, new, strict=True)) if o or nw]
        removed = [(k, new[k]) for k in ks if new[k]]
        for k, _ in removed:
            new[k] = []
        self.old = [0] * len(old)
        self.dirty = False
        self._pend(ResetFact(how, ks, removed, lazy, site))

    def reset_some(self, ks: Sequence[int], how: str, site: int = 0) -> bool:
        """Parameters ``ks`` were reset (a reset of this kind is recorded even where they
        held nothing). Returns whether that was every parameter."""
        self.fold()
        self.fold_consumed()
        old, new = self.old, self.new
        covered = [k for k in ks if old[k] or new[k]]
        removed = [(k, new[k]) for k in covered if new[k]]
        for k in covered:
            new[k] = []  # the lists themselves are handed over in removed
            old[k] = 0
        self._pend(ResetFact(how, covered, removed, (), site))
        if len(ks) < len(self.params):
            return False
        self.hand.forget()
        return True

    def _pend(self, fact: ResetFact) -> None:
        if fact.removed and self.judge is not None:
            fact = self.judge(fact)
        pending = self.pending
        pending.append(fact)
        if len(pending) > _MAX_PENDING:
            # An optimizer that never steps (SAM's own, under ``gradwatch run``) would keep
            # every reset: forget the oldest half, which no step will judge any more.
            del pending[:_MAX_PENDING // 2]

    def take_resets(self) -> list[ResetFact]:
        """The resets since the last step, handed over; the next step starts a new list."""
        pending, self.pending = self.pending, []
        return pending

    # ---------------------------------------------------------------- consumption
    def settled(self) -> bool:
        """No gradient holds consumed content, no armed backward waits: bulk counting may
        apply."""
        return not (self.dirty or self.lazy_old or self.hand.backwards)

    def take_textbook(self, uid: int, grads: Grads
                      ) -> tuple[Hits, list[ResetFact]] | None:
        """The textbook step's take, when every gradient of ``grads`` exists and holds only
        fresh content (settled), no reset since removed anything, and the hooks' list holds
        the last backward's marker, then its contributions, none leaked: that list as it
        is and the resets since the last step, handed over, and ``grads`` marked consumed
        (as :meth:`take_resets` and :meth:`consumed`). Else None, changing nothing.

        The usual step's whole accounting in one frame (it runs on the training thread at
        every step): each test reads a field, and nothing is re-read by the steps above.
        """
        raw = self.incoming
        if (self.dirty or self.lazy_old or self.hits or len(raw) < 2
                or self.hand.backwards):
            return None
        # Plain loops, not ``any(map(...))``: this runs right after torch's backward, where
        # each C helper's code is cold; the interpreter's own loop is not (bench/islands.py).
        for reset in self.pending:
            if reset.removed:
                return None
        for g in grads:
            if g is None:
                return None
        h0 = raw[0]
        backwards = self.backwards
        if type(h0) is not int or h0 != -backwards.last or not (
                backwards.single or backwards.claim(uid, (-h0,))):
            return None
        hits = raw.copy()
        raw.clear()  # in place: the hooks hold its append
        self.cur_bw = -h0
        self.lazy_old.append(hits)
        resets, self.pending = self.pending, []
        hand = self.hand  # (HandResets.hold, inlined: its identities taken if ever needed)
        hand.held, hand.ready, hand.pre_check = grads, False, None
        return hits, resets

    def take_bulk(self, uid: int, tally: StepTally) -> bool:
        """No gradient holds consumed content: count the hits (pulled) in bulk into
        ``tally``, after any number of backwards, and keep them for the next reset. False,
        changing nothing, when a contribution leaked (counted per parameter)."""
        hits = self.hits
        n = len(hits)
        if n and (h0 := hits[0]) < 0 and min(hits) == h0:
            # One backward since the last consumption (markers only decrease): no scan.
            marks = [0]
            bws = [-h0] if n > 1 else []
        else:
            marks = [j for j, h in enumerate(hits) if h < 0]
            bws = [-hits[j] for j in marks if j + 1 < n and hits[j + 1] >= 0]
            if n and hits[0] >= 0:
                bws.append(self.cur_bw)
        if not self.backwards.claim(uid, bws):
            return False
        if marks:
            self.cur_bw = -hits[marks[-1]]
        self.hits = []
        self.lazy_old.append(hits)
        total = n - len(marks)
        tally.fresh += total
        tally.consumed += total
        tally.bws.update(bws)
        tally.fresh_hits.append(hits)
        return True

    def bulk_countable(self, grads: Grads, missing: bool) -> bool:
        """After :meth:`pull`: whether the step may count in bulk (settled, and no gradient
        gone since a contribution it had)."""
        if not self.settled():
            return False
        return not missing or {k for k, g in enumerate(grads) if g is None}.isdisjoint(
            self.hits)

    def take_each(self, grads: Grads, uid: int, tally: StepTally
                  ) -> tuple[list[int], list[tuple[int, int]]]:
        """Count the step's reading of ``grads`` parameter by parameter into ``tally``,
        judging what reset each gradient since (some holds consumed content, or lost its
        fresh one). Returns the parameters with nothing fresh, and ``(k, n fresh)`` of
        those holding stale and fresh content."""
        self.fold()
        self.fold_consumed()
        self.dirty = True
        self.hand.observe()
        old, new = self.old, self.new
        leaked_of = self.backwards.leaked
        suspicious: list[int] = []
        zero: list[int] = []
        mixed: list[tuple[int, int]] = []
        bws_now: set[int] = set()
        for k, g in enumerate(grads):
            nw = new[k]
            o = old[k]
            if g is None:
                if nw or o:
                    self.reset(k, "set_none")  # p.grad = None outside zero_grad
                continue
            if not nw:
                if o:
                    cur = self.hand.current(k)
                    if cur is g:
                        suspicious.append(k)  # still the consumed gradient, or zeroed?
                    else:
                        self.reset(k, "set_none" if cur is None else "replaced")
                        zero.append(k)
                else:
                    zero.append(k)
                continue
            if o:
                tally.stale += o
                tally.stale_params.add(k)
                mixed.append((k, len(nw)))
            leaked = leaked_of(uid, nw)
            if leaked:
                tally.leaked += len(leaked)
                tally.leaked_params.add(k)
                tally.leaked_bws.update(leaked)
            tally.fresh += len(nw) - len(leaked)
            bws_now.update(nw)
            tally.fresh_params.add(k)
            tally.consumed += o + len(nw)
            old[k] = o + len(nw)
            new[k] = []
        if suspicious:
            vals = values([g for k in suspicious if (g := grads[k]) is not None])
            for k, v in zip(suspicious, vals, strict=True):
                zero.append(k)
                if v == 0.0:
                    self.reset(k, "zero_")  # p.grad.data.zero_() outside zero_grad
                else:  # an untouched parameter still carrying a consumed gradient
                    tally.stale += old[k]
                    tally.stale_params.add(k)
                    tally.consumed += old[k]
        if tally.stale:
            tally.stale_sites.update(self.old_sites)
        tally.bws.update(bws_now)
        self._consumed_from(bws_now)
        return zero, mixed

    def unconsumed(self, grads: Grads) -> set[int]:
        """The backwards of the unconsumed contributions that ``grads`` hold."""
        self.fold()
        out: set[int] = set()
        for g, nw in zip(grads, self.new, strict=True):
            if g is not None and nw:
                out.update(nw)
        return out

    def consumed(self, grads: Grads) -> None:
        """A step read ``grads``: their content is consumed from now on."""
        self.hand.hold(grads)

    def watch_backward(self, bw: int) -> ArmedBackward:
        """Backward ``bw`` starts while armed: the ``.grad`` state before it, completed when
        the engine returns (:meth:`ArmedBackward.done`)."""
        self.fold_consumed()
        return self.hand.watch(bw, self.old)
