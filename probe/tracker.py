"""The tracker: attaches to optimizers and routes torch's events to their ledgers.

Thread: training (step hooks and wrappers run in the user's training thread; on a GPU the
autograd engine's device threads run the per-parameter hooks, which only append to a list).

Hot path (per parameter, per backward): the hook is the bound ``append`` of its ledger's
hooks' list, so a contribution costs the engine's call and no Python frame. Backward passes
are told apart by a marker the wrapper of ``torch.autograd.backward``
(:mod:`gradwatch.probe.patches`) appends before the engine runs (:meth:`Tracker.begin`); a
backward run inside another one (reentrant checkpointing) belongs to the outer one. On the
rare *armed* path (a step without a following ``zero_grad``) the wrapper also takes the
``.grad`` state around the backward. Everything else runs once per step (the step pre-hook,
plus a post-hook for closure steps) or in the ``zero_grad`` wrappers. Each backward and
reset call also notes its call site (:mod:`gradwatch.probe.sites`), a step only when its
facts hold a finding.

A backward that calls the autograd engine without ``torch.autograd.backward`` (Megatron's
``custom_backward``), or through a reference to it taken before the watch started, gets no
marker of its own: its contributions are counted, as part of the backward before it.

What no watched optimizer holds (:mod:`gradwatch.probe.unowned`: updates by hand, untrained
parameters) is looked at where a backward starts and ends, at ``Module.zero_grad`` and at
close, only while there is something to look at; whether each optimizer's parameters ever
hold a gradient (:mod:`gradwatch.probe.holding`), after its first steps.

Any internal error is logged once and the tracker turns itself off; training goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
from pydantic import BaseModel
from torch.utils.hooks import RemovableHandle

from gradwatch.probe import patches
from gradwatch.probe.backwards import Backwards
from gradwatch.probe.facts import JudgedStep, StepCount, StepFacts
from gradwatch.probe.handresets import ArmedBackward
from gradwatch.probe.holding import Holdings
from gradwatch.probe.hparams import group_hparams
from gradwatch.probe.ledger import Ledger
from gradwatch.probe.losses import Roots, learning_rates
from gradwatch.probe.manual import Doors, ManualUpdates
from gradwatch.probe.names import Namer, positional
from gradwatch.probe.nocompile import no_compile
from gradwatch.probe.shards import placements
from gradwatch.probe.sites import Sites
from gradwatch.probe.unowned import Unowned
from gradwatch.wire import NAME_MAX_CHARS, OptimizerInfo, clip

log = logging.getLogger("gradwatch.probe")

_queue_callback = torch.autograd.Variable._execution_engine.queue_callback
_Tensor = torch.Tensor
_MAX_HITS = 1_000_000
"""Raw hits kept per optimizer before they are folded (backwards with no step nor reset),
checked every :data:`_CHECK_EVERY` backwards."""
_CHECK_EVERY = 1024

Emit = Callable[[StepFacts | BaseModel], None]
"""Where step facts and records go (the writer's ``put``): never blocks."""
StepArgs = tuple[tuple[Any, ...], dict[str, Any]]
"""A step's ``(args, kwargs)``, as torch hands them to a step pre-hook."""
_END_ONLY: list[tuple[Ledger, ArmedBackward | None]] = []
"""What :meth:`Tracker.begin` returns when no ledger needs :meth:`Tracker.end` but the
parameters no optimizer holds do (shared, never written)."""


def _in_backward() -> bool:
    return bool(torch._C._current_graph_task_id() != -1)


class Tracker:
    """Tracks the optimizers of one watch session: each gets a :class:`Ledger`, and the
    tracker routes torch's events to it, handing each step's facts to ``emit``."""

    __slots__ = ("on", "backwards", "ledgers", "marks", "by_param", "handles", "own_hooks",
                 "post_hooked", "unhooked", "emit", "norms_every", "namer", "auto",
                 "on_disable", "disabled", "step_count", "_names_taken", "labeler", "labels",
                 "sites", "shared", "unowned", "holdings", "roots", "last_step", "unlabelled",
                 "phase_starts", "check_at")

    def __init__(self, emit: Emit, *, norms_every: int = 1, namer: Namer | None = None,
                 auto: bool = False, on_disable: Callable[[str], None] | None = None,
                 labeler: Callable[[torch.optim.Optimizer], str | None] | None = None):
        self.on = True
        """False once turned off (an internal error, or closed)."""
        self.by_param: dict[torch.Tensor, list[tuple[Ledger, int]]] = {}
        self.backwards: Backwards[Ledger] = Backwards(held=self.by_param)
        self.ledgers: dict[torch.optim.Optimizer, Ledger] = {}
        self.marks: list[Callable[[int], None]] = []
        """Each ledger's ``incoming.append``: where a backward's marker goes."""
        self.check_at = _CHECK_EVERY
        """The backward at which losses and hits kept are next trimmed (every
        :data:`_CHECK_EVERY`)."""
        self.phase_starts: list[Callable[[], None]] = []
        """Each ledger's :attr:`~Ledger.on_phase`: what a phase's first backward calls."""
        self.shared: set[Ledger] = set()
        """Ledgers holding a parameter another ledger holds too (SAM and its base
        optimizer, under ``gradwatch run``)."""
        self.sites = Sites(emit)
        self.handles: list[RemovableHandle] = []
        self.own_hooks: set[Ledger] = set()
        """Ledgers whose optimizer has step hooks of its own (not the global ones of
        ``gradwatch run``)."""
        self.post_hooked: set[Ledger] = set()
        self.unhooked: dict[Ledger, list[int]] = {}
        """Parameters without a hook yet (not requiring grad when attached)."""
        self.emit = emit
        self.norms_every = norms_every
        self.namer = namer
        self.auto = auto
        self.on_disable = on_disable
        self.disabled: str | None = None
        self.step_count = StepCount()
        self._names_taken: set[str] = set()
        self.labeler = labeler
        """Finds what the user calls an optimizer given no name (its display label)."""
        self.labels: dict[Ledger, str] = {}
        self.unlabelled: set[Ledger] = set()
        """Ledgers the labeler found no name for when attached: asked again at their first
        step, whose caller holds the optimizer (``opt.step()``)."""
        # issue 20 (lifecycle findings, loops with no optimizer): what no optimizer holds
        self.unowned = Unowned(
            owned=self.by_param, watched=self.ledgers, backwards=self.backwards,
            steps=self.step_count, emit=emit, namer=namer, auto=auto,
            manual=Doors(attach=self._attach_unhooked, grew=self.opt_add_param_group,
                         emit_step=self._emit_step, norms_every=norms_every))
        self.holdings = Holdings(self.emit)
        self.roots = Roots()
        """The loss of each step: what its backwards started from."""
        self.last_step: tuple[str, int] | None = None
        """``(optimizer, step)`` of the run's latest step (``WatchHandle.log``'s default)."""

    # ---------------------------------------------------------------- attach
    def attach(self, opt: torch.optim.Optimizer, name: str | None = None,
               instance_hooks: bool = True) -> Ledger:
        """Start tracking ``opt``; returns its ledger (the existing one if already tracked)."""
        led = self.ledgers.get(opt)
        if led is not None:
            return led
        params: list[torch.Tensor] = []
        groups: list[int] = []
        for gi, group in enumerate(opt.param_groups):
            for p in group["params"]:
                params.append(p)
                groups.append(gi)
        label = self.labeler(opt) if name is None and self.labeler is not None else None
        given = name is not None
        if name is None:
            name = f"{type(opt).__name__}#{len(self.ledgers)}"
        while name in self._names_taken:
            name += "'"
        self._names_taken.add(name)
        led = Ledger(opt, name, params, groups, self.backwards, self.norms_every)
        if label:
            self._label(led, label)
        elif not given and self.labeler is not None:
            self.unlabelled.add(led)
        self.ledgers[opt] = led
        self.marks.append(led.incoming.append)
        self.phase_starts.append(led.on_phase)
        self._track(led, range(len(params)))
        if not isinstance(opt, ManualUpdates):  # idle_optimizer: does it ever hold a grad?
            self.holdings.watch(led)
        if instance_hooks:  # torch.compile must not trace into it
            self.own_hooks.add(led)
            self.handles.append(opt.register_step_pre_hook(no_compile(self.pre)))
        self._announce(led)
        return led

    def _attach_unhooked(self, opt: torch.optim.Optimizer, name: str) -> Ledger:
        """Track ``opt`` under ``name`` with no step hooks (``manual``'s stand-in, which
        steps through the tracker)."""
        return self.attach(opt, name, instance_hooks=False)

    @property
    def steps(self) -> int:
        """Steps taken so far by every optimizer of the session."""
        return self.step_count.n

    def _label(self, led: Ledger, label: str) -> None:
        # unique: a label two optimizers share gets the id too
        self.labels[led] = (label if label not in self.labels.values()
                            else f"{label} ({led.name})")

    def _label_at_first_step(self, led: Ledger) -> None:
        """Name an optimizer ``watch()`` could not name by what its first ``step()``'s
        caller holds it as; announce it again under that name."""
        self.unlabelled.discard(led)
        label = self.labeler(led.opt) if self.labeler is not None else None
        if label:
            self._label(led, label)
            self._announce(led)

    def _track(self, led: Ledger, ks: range) -> None:
        for k in ks:
            holders = self.by_param.setdefault(led.params[k], [])
            holders.append((led, k))
            if len(holders) > 1:
                self.shared.update(other for other, _ in holders)
            self._hook(led, k)
        led.found(ks)

    def _announce(self, led: Ledger) -> None:
        """Emit the optimizer's parameters (names, shapes, groups) as they are now."""
        names = (self.namer or positional)(led.params, led.groups)
        manual = False
        if isinstance(led.opt, ManualUpdates):  # the virtual optimizer of updates by hand
            manual, names = True, led.opt.named(led.params, names)
        self.emit(OptimizerInfo(seq=0, t=time.time(), opt=led.name, cls=type(led.opt).__name__,
                                params=[clip(n, NAME_MAX_CHARS) for n in names],
                                shapes=[list(p.shape) for p in led.params],
                                groups=list(led.groups), label=self.labels.get(led),
                                hparams=[] if manual else group_hparams(led.opt),
                                manual=manual, placements=placements(led.params)))

    def opt_add_param_group(self, opt: torch.optim.Optimizer) -> None:
        """After ``Optimizer.add_param_group`` (progressive unfreezing): track the new
        parameters from now on, after the existing ones, and announce the longer list."""
        led = self.ledgers.get(opt)
        if led is None or not self.on:
            return
        try:
            known = set(led.params)
            added = [(gi, p) for gi, group in enumerate(opt.param_groups)
                     for p in group["params"] if p not in known]
            if not added:
                return
            self._track(led, led.add([p for _, p in added], [gi for gi, _ in added]))
            self._announce(led)
        except Exception as e:  # noqa: BLE001
            self.fail(e)

    def _hook(self, led: Ledger, k: int) -> None:
        p = led.params[k]
        if not p.requires_grad or p.grad_fn is not None:
            self.unhooked.setdefault(led, []).append(k)
            return
        handle = p.register_post_accumulate_grad_hook(led.incoming.append)
        self.handles.append(handle)
        hooks = p._post_accumulate_grad_hooks
        if isinstance(hooks, dict) and len(hooks) > 1:
            # First, before the user's own hooks: one that steps the optimizer (the
            # optimizer-in-backward pattern) must find this contribution already counted.
            # The engine walks the dict's own order (not OrderedDict's): re-insert all.
            mine = hooks.pop(handle.id)
            others = list(hooks.items())
            hooks.clear()
            hooks[handle.id] = mine
            hooks.update(others)

    # ---------------------------------------------------------------- backward
    def begin(self, roots: Any = None, tensors: Any = None
              ) -> list[tuple[Ledger, ArmedBackward | None]] | None:
        """A backward pass from ``roots`` starts (the engine has not run yet): number it,
        note where it was called and the value of what it starts from (``tensors``, as
        passed, for the loss: ``roots`` is None when the graph is retained), and mark it.

        Armed ledgers (their consumed gradients not cleared by zero_grad) also get their
        ``.grad`` state taken, and lossy ones (a reset threw contributions away) their
        gradients after it: returned for :meth:`end`; None when no ledger is either.
        Called by the wrapper of ``torch.autograd.backward`` only: the call site is the
        wrapper's caller.
        """
        if not self.on:
            return None
        try:
            unowned = self.unowned
            if unowned.active:  # parameters updated by hand since the last backward: a step
                unowned.boundary()
            b = self.backwards
            # (called only by the backward wrapper: the walk starts above its frame)
            bw = b.begin(self.sites.here("backward", 2), roots, tensors)
            values = self.roots
            if values.on:
                t = tensors
                try:  # :meth:`Roots.note`'s usual case (a CPU loss, read here), inlined
                    # with the fewest torch calls: ``item()`` itself refuses a tensor of
                    # several numbers, and gives a float only for a floating-point one
                    if (type(t) is _Tensor and t.is_cpu and not values.scaled
                            and type(v := t.item()) is float):
                        values.waiting[bw] = [v]
                    else:
                        values.note(bw, t)
                except Exception:  # noqa: BLE001 - note's way (it reads what item refused)
                    values.note(bw, t)
            if b.phase_began:
                for began in self.phase_starts:
                    began()
            if bw >= self.check_at:  # (a comparison: ``%`` is a C call, costly here)
                self.check_at = bw + _CHECK_EVERY
                values.trim()
                for led in self.ledgers.values():
                    led.fold_if_over(_MAX_HITS)
            marker = -bw
            for mark in self.marks:
                mark(marker)
            armed, lossy = b.armed, b.lossy
            if not armed and not lossy:
                return _END_ONLY if unowned.wants_end else None
            return [(led, led.backward_begins(bw)) for led in (armed | lossy)]
        except Exception as e:  # noqa: BLE001 - never raise into the training loop
            self.fail(e)
            return None

    def end(self, armed: list[tuple[Ledger, ArmedBackward | None]]) -> None:
        """The engine returned (or raised): take the armed and lossy ledgers' gradients."""
        if not self.on:
            return
        try:
            for led, seen in armed:
                led.backward_ends(seen)
            if self.unowned.wants_end:  # the gradients an update by hand will read
                self.unowned.after_backward()
        except Exception as e:  # noqa: BLE001
            self.fail(e)

    # ---------------------------------------------------------------- step hooks
    def pre(self, opt: torch.optim.Optimizer, args: tuple[Any, ...],
            kwargs: dict[str, Any]) -> StepArgs | None:
        """Optimizer step pre-hook: count the step (or wrap its closure)."""
        if not self.on:
            return None
        try:
            led = self.ledgers.get(opt)
            if led is None:
                if not self.auto:
                    return None
                led = self.attach(opt, instance_hooks=False)
            if self.unlabelled and led in self.unlabelled:
                self._label_at_first_step(led)
            if self.unhooked and (late := self.unhooked.pop(led, None)):
                for k in late:
                    self._hook(led, k)
            # torch passes the step's own args, ``self`` first: (self, closure?); the usual
            # ``opt.step()`` passes nothing else (no lookup then: each C call costs here)
            closure = args[1] if len(args) > 1 else kwargs.get("closure") if kwargs else None
            if closure is not None and callable(closure):
                led.open_closure_step()
                if led not in self.post_hooked:  # registered now, it runs after this step
                    self.post_hooked.add(led)
                    if led in self.own_hooks:
                        self.handles.append(opt.register_step_post_hook(no_compile(self.post)))
                    else:  # ``gradwatch run``'s: the session's global post-hook
                        patches.need_post(self)
                wrapped = self._wrap_closure(led, closure)
                if len(args) > 1:
                    return (args[0], wrapped, *args[2:]), kwargs
                return args, {**kwargs, "closure": wrapped}
            # Without a closure the step reads its gradients now and nothing after:
            # the record is complete at step entry (no post-hook call per step).
            self._emit_step(led.plain_step(), opt)
        except Exception as e:  # noqa: BLE001
            self.fail(e)
        return None

    def post(self, opt: torch.optim.Optimizer, args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> None:
        """Optimizer step post-hook (closure steps): hand the step's facts over."""
        if not self.on:
            return
        try:
            led = self.ledgers.get(opt)
            if led is not None and (facts := led.close_closure_step()) is not None:
                self._emit_step(facts, opt)
        except Exception as e:  # noqa: BLE001
            self.fail(e)

    def _emit_step(self, facts: StepFacts, opt: Any = None) -> None:
        if isinstance(facts, JudgedStep):
            if facts.sites is not None:
                facts.sites.step = self.sites.here("step")
                if facts.tally.stale and not facts.sites.reset:  # no reset seen: the
                    facts.sites.reset = self.sites.hook_site()  # hook meant to make it
            facts.roots = self.roots.take(facts.tally.bws)
        else:  # textbook: one backward, whose marker leads the hooks' list
            values, bw = self.roots, -facts.hits[0]
            # :meth:`Roots.take`'s usual case (its value waiting), inlined: no frame of its
            # own in the step's island; any other case through it
            v = values.waiting.pop(bw, None) if values.on else None
            if v is not None:
                values.recent[bw] = v
                facts.roots = v
            else:
                facts.roots = values.take((bw,))
        if opt is not None:
            # :func:`learning_rates`' first case inlined (one group, a float lr: no frame on
            # the usual step); every check is a type test, so nothing here can raise
            groups = getattr(opt, "param_groups", None)
            if (type(groups) is list and len(groups) == 1 and type(g := groups[0]) is dict
                    and type(lr := g.get("lr")) is float):
                facts.lr = [lr]
            else:
                facts.lr = learning_rates(opt)
        self.last_step = (facts.opt, facts.step)
        self.emit(facts)
        self.step_count.n += 1
        if self.holdings.pending:  # idle_optimizer: checked at steps 0, 1, 2, 4, 8, ...
            self.holdings.stepped(facts)

    def reached(self, leaves: list[torch.Tensor]) -> None:
        """A sampled backward (:mod:`gradwatch.probe.reach`) writes the grads of ``leaves``."""
        if not self.on:
            return
        try:
            self.unowned.reached(leaves)
        except Exception as e:  # noqa: BLE001
            self.fail(e)

    def _wrap_closure(self, led: Ledger, closure: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*a: Any, **kw: Any) -> Any:
            out = closure(*a, **kw)
            if self.on:
                try:
                    led.consume(closure=True)
                except Exception as e:  # noqa: BLE001
                    self.fail(e)
            return out

        return wrapped

    # ---------------------------------------------------------------- reset signals
    def opt_zero_grad(self, opt: torch.optim.Optimizer) -> None:
        """After ``Optimizer.zero_grad``: every parameter of ``opt`` was reset, also for the
        other ledgers that hold some of them (SAM resets through an optimizer of its own
        over its base optimizer's parameters). Called by the wrapper of ``zero_grad`` only
        (:mod:`gradwatch.probe.patches`): the call site is the wrapper's caller."""
        if not self.on:
            return
        try:
            led = self.ledgers.get(opt)
            if led is not None and led not in self.shared:  # the usual case
                # :meth:`Ledger.after_zero_grad`, inlined: no frame of its own in the island
                site = self.sites.here("reset", 2)  # (above the zero_grad wrapper's frame)
                if led.norms.began:
                    led.norms.reset()
                led.contents.reset_all("optimizer_zero_grad", site)
                led.backwards.armed.discard(led)
                led.reset_site = site
                return
            if not self.by_param:
                return
            covered = self._covered(p for g in opt.param_groups for p in g["params"])
            covered.pop(led, None)  # type: ignore[arg-type]
            if led is None and not covered:
                return
            site = self.sites.here("reset", 2)
            if led is not None:
                led.after_zero_grad(site)
            for other, ks in covered.items():
                other.after_module_zero_grad(ks, site, "optimizer_zero_grad")
        except Exception as e:  # noqa: BLE001
            self.fail(e)

    def module_zero_grad(self, module: torch.nn.Module) -> None:
        """After ``Module.zero_grad``: the module's parameters were reset (called by its
        wrapper only, as :meth:`opt_zero_grad`)."""
        if not self.on:
            return
        try:
            if self.unowned.active:  # an update by hand before this reset came first
                self.unowned.boundary()
            if not self.by_param:
                return
            covered = self._covered(module.parameters())
            if not covered:
                return
            site = self.sites.here("reset", 2)
            for led, ks in covered.items():
                led.after_module_zero_grad(ks, site)
        except Exception as e:  # noqa: BLE001
            self.fail(e)

    def _covered(self, params: Iterable[torch.Tensor]) -> dict[Ledger, list[int]]:
        """The ledgers holding some of ``params``, with their indices."""
        covered: dict[Ledger, list[int]] = {}
        for p in params:
            for led, k in self.by_param.get(p, ()):
                covered.setdefault(led, []).append(k)
        return covered

    def scaler_before(self, opt: Any) -> tuple[Ledger, int] | None:
        """Before ``GradScaler.step``: a token for :meth:`scaler_after` (None: not ours)."""
        led = self.ledgers.get(opt)
        if led is None and self.auto and self.on and isinstance(opt, torch.optim.Optimizer):
            led = self.attach(opt, instance_hooks=False)
        return None if led is None else (led, led.step)

    def scaler_after(self, token: tuple[Ledger, int] | None) -> None:
        """After ``GradScaler.step``: if the optimizer did not step, record a skipped step."""
        if token is None or not self.on:
            return
        led, before = token
        if led.step != before:
            return
        try:
            self._emit_step(led.skipped_step(), led.opt)
        except Exception as e:  # noqa: BLE001
            self.fail(e)

    # ---------------------------------------------------------------- lifecycle
    def fail(self, exc: BaseException) -> None:
        """Log the internal error once, turn the probe off; training goes on."""
        if not self.on:
            return
        self.on = False
        self.disabled = f"{type(exc).__name__}: {exc}"[:1000]
        log.error("gradwatch: internal error, the probe turns itself off and training "
                  "goes on: %s", self.disabled, exc_info=exc)
        if _in_backward():  # hooks are not removed while the engine may be calling them
            _queue_callback(self.remove_hooks)
        else:
            self.remove_hooks()
        if self.on_disable is not None:
            try:
                self.on_disable(self.disabled)
            except Exception:  # noqa: BLE001
                log.debug("on_disable failed", exc_info=True)

    def remove_hooks(self) -> None:
        """Remove every hook; once off, drop what they appended since."""
        for h in self.handles:
            h.remove()
        self.handles.clear()
        if not self.on:
            for led in self.ledgers.values():
                led.release()

    def close(self) -> None:
        """Remove every hook and turn off (the session ends)."""
        if self.on:
            try:
                self.unowned.close()
            except Exception as e:  # noqa: BLE001
                self.fail(e)
        self.on = False
        self.remove_hooks()
