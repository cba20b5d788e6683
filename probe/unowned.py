"""Tensors the backwards reach that no watched optimizer holds: updated by hand (the virtual
optimizer ``manual``) or left untrained (``untrained_params``).

Thread: training (the tracker routes the sampled graph walks, the backward boundaries and
``Module.zero_grad`` here).

The sampled walks (:mod:`gradwatch.probe.reach`) name the leaves a backward writes a
gradient into; those no watched optimizer holds are followed here, weakly (an input made to
require grad dies with its batch). At each *boundary* (a backward starting, a
``Module.zero_grad``, the session's end) the probe looks at each followed leaf: its version
(an update under ``torch.no_grad()`` moves it) and its norm (an update through ``.data``
does not move the version).

A leaf that changed while it held a gradient was updated by hand: that update consumed the
gradient, a step of the virtual optimizer (:mod:`gradwatch.probe.manual`), which the leaf
joins. An ``nn.Parameter`` joins at once. A plain tensor may be made anew for each batch and
dropped after a few updates (an adversarial perturbation), and joining would hold it alive
for good; so beside a watched optimizer it joins once it has lived through one of its steps.
In a session that watches none (a loop with no optimizer, whose plain tensors are its
parameters) it joins at its first update, so that every update is judged, unless a plain
tensor of its shape that joined before is no longer reached by the backwards (then tensors
are being made anew: no more join that way, and at most one of them is held).

A leaf that stays unchanged for :data:`PROBATION` boundaries is *settled*, looked at again
only every :data:`SLOW` boundaries; a settled ``nn.Parameter`` is *untrained* once
optimizers have stepped :data:`MIN_STEPS` times since it was first seen, and reported in a
:class:`~gradwatch.wire.Unowned` record (sent again when the list changes, when the walks
reaching it double, and at the end).

Costs: nothing while every leaf the walks find is held by a watched optimizer (the usual
run). Otherwise one norm per followed leaf at each boundary while it is on probation or
updated by hand, read on the host (on a GPU, one small copy per boundary, in those runs
only), and the gradients of those leaves are held from the end of a backward to the next
boundary.
"""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch
from pydantic import BaseModel

from gradwatch.probe import names
from gradwatch.probe.backwards import Backwards
from gradwatch.probe.facts import StepCount
from gradwatch.probe.manual import Doors, Manual, named_by_frames
from gradwatch.probe.norms import local_values
from gradwatch.probe.shards import local, readable
from gradwatch.wire import NAME_MAX_CHARS, clip
from gradwatch.wire import Unowned as UnownedRecord

PROBATION = 8
"""Boundaries a leaf stays unchanged before it is settled."""
MIN_STEPS = 2
"""Optimizer steps in the run, since a parameter was first seen, before it is untrained."""
SLOW = 64
"""A settled leaf is looked at once every this many boundaries."""
MAX_LEAVES = 10_000
"""Leaves followed at most (more are left alone)."""
_MAX_NAMED = 1000


class _Leaf:
    __slots__ = ("ref", "param", "first", "last", "steps0", "real0", "ver", "norm", "quiet",
                 "walks")

    def __init__(self, t: torch.Tensor, bw: int, steps: int, real: int) -> None:
        self.ref = weakref.ref(t)
        self.param = isinstance(t, torch.nn.Parameter)
        self.first = self.last = bw
        """The backwards of the first and the last walk that found it."""
        self.steps0 = steps
        """Steps of every optimizer (``manual`` included) when it was found."""
        self.real0 = real
        """Steps of the watched optimizers when it was found."""
        self.ver: int | None = None
        self.norm = 0.0
        self.quiet = 0
        """Boundaries it stayed unchanged at."""
        self.walks = 1


def _changed(ver: int, norm: float, ver0: int | None, norm0: float) -> bool:
    # NaN never equals itself: a NaN norm that stays NaN is no change
    return ver != ver0 or (norm != norm0 and not (norm != norm and norm0 != norm0))


class Unowned:
    """The leaves no watched optimizer holds, the virtual optimizer and the untrained
    parameters of one session. Owned by the tracker, which hands it what it reads: the
    parameters and optimizers it watches (mappings it keeps up to date), its backwards and
    its step count, where records go, and the virtual optimizer's doors."""

    def __init__(self, *, owned: Mapping[torch.Tensor, Any], watched: Mapping[Any, Any],
                 backwards: Backwards[Any], steps: StepCount,
                 emit: Callable[[BaseModel], None], namer: names.Namer | None, auto: bool,
                 manual: Doors) -> None:
        self.owned = owned
        """The parameters a watched optimizer holds."""
        self.watched = watched
        """The watched optimizers (``manual`` among them once it exists)."""
        self.backwards = backwards
        self.steps = steps
        self.emit = emit
        self.namer = namer
        self.auto = auto
        """Every optimizer the script makes is watched (``gradwatch run``)."""
        self.manual = Manual(manual)
        self.probation: dict[int, _Leaf] = {}
        self.settled: dict[int, _Leaf] = {}
        self.plain: dict[int, tuple[tuple[int, ...], int]] = {}
        """Plain tensors in ``manual``: ``id`` -> shape and the last walk that reached it."""
        self.churn = False
        """Plain tensors made anew were seen: with no optimizer they join no more."""
        self.elsewhere: dict[int, weakref.ref[torch.Tensor]] = {}
        """Leaves an optimizer the session does not watch holds, or whose storage was seen
        freed (FSDP2's all-gathered parameters): left alone."""
        self.untrained: dict[int, _Leaf] = {}
        self.member_fp: dict[int, tuple[int, float]] = {}
        """``id(param)`` -> version and norm of each ``manual`` parameter at the last
        boundary."""
        self.end_grads: dict[int, torch.Tensor] = {}
        self.tick = 0
        self.reaching = 0
        """Sampled walks that reached a parameter already untrained."""
        self.first_step: int | None = None
        self.sent: tuple[int, int, int] | None = None
        """What the last record sent counted (:meth:`_counts`)."""
        self.dirty = False
        """The untrained parameters changed since the last record."""
        self.active = False
        """Boundaries have something to look at."""
        self.wants_end = False
        """The end of each backward has something to take."""

    # ---------------------------------------------------------------- walks
    def reached(self, leaves: list[torch.Tensor]) -> None:
        """A sampled walk found ``leaves`` (the backward about to run writes their grads)."""
        # the watched parameters by id: ``t in self.owned`` would call the Python-level
        # ``Tensor.__hash__`` once per leaf (a walk meets every parameter)
        owned = set(map(id, self.owned))
        bw = self.backwards.last + 1
        steps, real = self.steps.n, self._real_steps()
        hit = False
        for t in leaves:
            if id(t) in owned:
                if id(t) in self.plain:
                    self.plain[id(t)] = (self.plain[id(t)][0], bw)
                continue
            key = id(t)
            lf = self.probation.get(key) or self.settled.get(key)
            if lf is not None and lf.ref() is t:
                lf.last = bw
                lf.walks += 1
                hit = hit or key in self.untrained
                continue
            gone = self.elsewhere.get(key)
            if gone is not None and gone() is t:
                continue
            if not readable(local(t)):  # FSDP2's all-gathered parameter, freed: its own
                self.elsewhere[key] = weakref.ref(t)
                continue
            if len(self.probation) + len(self.settled) < MAX_LEAVES:
                self.probation[key] = _Leaf(t, bw, steps, real)
        if hit:
            self.reaching += 1
            if not self.reaching & (self.reaching - 1):  # sent again at 1, 2, 4, 8, ...
                self._send()
        self._update()

    # ---------------------------------------------------------------- boundaries
    def boundary(self) -> None:
        """A backward starts, or ``Module.zero_grad`` ran: look at the followed leaves and
        the ``manual`` parameters; an update by hand since the last boundary is a step."""
        self.tick += 1
        look = self._alive(self.probation)
        if self.tick % SLOW == 0:
            look += self._alive(self.settled)
        members = self.manual.params
        # each tensor made local once: its version and its norm read from the same one
        shards = [*map(local, members), *(loc for _, _, loc in look)]
        if not shards:
            self._after_boundary()
            return
        vers = [s._version for s in shards]
        norms = local_values(shards)
        m = len(members)
        fp = self.member_fp
        moved = False
        for j, p in enumerate(members):
            last = fp.get(id(p))
            moved = moved or (last is not None and _changed(vers[j], norms[j], *last))
            fp[id(p)] = (vers[j], norms[j])
        joins: list[tuple[_Leaf, torch.Tensor]] = []
        idle: list[tuple[_Leaf, torch.Tensor]] = []
        joined_at: dict[int, int] = {}  # the version each joining tensor was looked at in
        steps, real = self.steps.n, self._real_steps()
        for j, (lf, t, _) in enumerate(look, m):
            key = id(t)
            if lf.ver is not None and _changed(vers[j], norms[j], lf.ver, lf.norm):
                lf.quiet = 0
                if (key in self.end_grads or t.grad is not None) and (
                        lf.param or self._may_join(lf, t, real)):
                    joins.append((lf, t))  # updated by hand
                    joined_at[key] = vers[j]
            else:
                lf.quiet += 1
                if lf.quiet >= PROBATION and key in self.probation:
                    self.settled[key] = self.probation.pop(key)
                if (lf.param and key in self.settled and key not in self.untrained
                        and steps - lf.steps0 >= MIN_STEPS and t.grad is not None):
                    idle.append((lf, t))  # holds a gradient nothing applies
            lf.ver, lf.norm = vers[j], norms[j]
        if joins or idle:
            held = self._held_elsewhere(joins + idle)
            joins = [x for x in joins if id(x[1]) not in held]
            for lf, t in idle:
                if id(t) not in held:
                    self._untrained(id(t), lf)
        for lf, t in joins:
            key = id(t)
            if not lf.param:
                self.plain[key] = (tuple(t.shape), lf.last)
            self.probation.pop(key, None)
            self.settled.pop(key, None)
            if self.untrained.pop(key, None) is not None:
                self.dirty = True
            fp[key] = (joined_at[key], lf.norm)  # as looked at just now
        if moved or joins:
            self.manual.step([t for _, t in joins], self.end_grads)
        self._after_boundary()

    def after_backward(self) -> None:
        """A backward ended: hold the gradients it left on the leaves the next boundary may
        find updated, and let ``manual`` take its norms."""
        grads: dict[int, torch.Tensor] = {}
        for p in self.manual.params:
            if (g := p.grad) is not None:
                grads[id(p)] = g
        for _, t, _ in self._alive(self.probation):
            if (g := t.grad) is not None:
                grads[id(t)] = g
        self.end_grads = grads
        self.manual.after_backward()

    def close(self) -> None:
        """The session ends: an update by hand after the last backward is a step too; send
        the untrained parameters' last counts."""
        if self.manual.params:
            self.boundary()
        if self.untrained and self.sent != self._counts():
            self._send()

    # ---------------------------------------------------------------- internals
    def _alive(self, leaves: dict[int, _Leaf]
               ) -> list[tuple[_Leaf, torch.Tensor, torch.Tensor]]:
        """The leaves still alive and held by no watched optimizer, each with its local
        tensor (a DTensor's shard; the others are dropped: an untrained parameter an
        optimizer holds since stays untrained)."""
        out = []
        owned = self.owned
        dead = []
        for key, lf in leaves.items():
            t = lf.ref()
            if t is None or t in owned:
                dead.append(key)
            elif not readable(loc := local(t)):  # storage freed since (FSDP2 resharded it)
                dead.append(key)
                self.elsewhere[key] = lf.ref
            else:
                out.append((lf, t, loc))
        for key in dead:
            del leaves[key]
        return out

    def _real_steps(self) -> int:
        led = self.manual.led
        return self.steps.n - (led.step if led is not None else 0)

    def _may_join(self, lf: _Leaf, t: torch.Tensor, real: int) -> bool:
        """Whether a plain tensor updated by hand may join ``manual`` (module docstring)."""
        if real > lf.real0:
            return True  # lived through an optimizer's step: not made anew for a batch
        if (real or self.churn
                or len(self.watched) > (self.manual.led is not None)):
            return False  # an optimizer is watched: it has to live through one's step
        shape = tuple(t.shape)
        if any(s == shape and last < lf.first for s, last in self.plain.values()):
            self.churn = True  # one like it joined before and the backwards left it
            return False
        return True

    def _untrained(self, key: int, lf: _Leaf) -> None:
        self.untrained[key] = lf
        self.dirty = True
        if self.first_step is None:
            self.first_step = lf.steps0

    def _held_elsewhere(self, leaves: list[tuple[_Leaf, torch.Tensor]]) -> set[int]:
        """Ids of ``leaves`` that an optimizer the session does not watch holds, from now on
        left alone. Under ``gradwatch run`` the session watches every optimizer: none."""
        if self.auto:
            return set()
        watched = self.watched
        held: set[int] = set()
        opt_t = torch.optim.Optimizer
        for o in gc.get_objects():  # once per boundary that judges leaves (rare)
            if issubclass(type(o), opt_t) and o not in watched:
                for group in o.param_groups:
                    held.update(id(p) for p in group["params"])
        out = set()
        for lf, t in leaves:
            key = id(t)
            if key in held:
                out.add(key)
                self.elsewhere[key] = lf.ref
                self.probation.pop(key, None)
                self.settled.pop(key, None)
        return out

    def _after_boundary(self) -> None:
        self.end_grads = {}
        self._update()
        if self.dirty:
            self._send()

    def _update(self) -> None:
        members = bool(self.manual.params)
        self.wants_end = bool(self.probation) or members
        self.active = self.wants_end or bool(self.settled)

    def _counts(self) -> tuple[int, int, int]:
        return len(self.untrained), self.reaching, self.steps.n

    def _send(self) -> None:
        alive = [(lf, t) for lf in self.untrained.values() if (t := lf.ref()) is not None]
        params = [t for _, t in alive]
        namer = self.namer or names.from_frames
        named = params[:_MAX_NAMED]
        listed = named_by_frames(named, namer(named, None))  # type: ignore[arg-type]
        self.sent = self._counts()
        self.dirty = False
        self.emit(UnownedRecord(
            seq=0, t=time.time(), params=[clip(n, NAME_MAX_CHARS) for n in listed],
            shapes=[list(p.shape) for p in named], count=len(params),
            numel=sum(p.numel() for p in params),
            backwards=max((lf.walks for lf, _ in alive), default=0),
            first_step=self.first_step or 0, step=self.steps.n))
