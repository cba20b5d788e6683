"""The hooks: contributions from post-accumulate-grad hooks, resets from ``.grad`` state.

Hot path (per parameter, per backward): the hook is the bound ``append`` of its
optimizer's ``incoming`` list, so a contribution costs the engine's call and no Python
frame. Backward passes are told apart by a marker the wrapper of ``torch.autograd.backward``
(:mod:`gradwatch.probe.patches`) appends before the engine runs (:meth:`Tracker.begin`);
a backward run inside another one (reentrant checkpointing) belongs to the outer one. On
the rare *armed* path (a step without a following ``zero_grad``) the wrapper also takes the
``.grad`` state around the backward. Everything else runs once per step (the step
pre-hook, plus a post-hook for closure steps) or in the ``zero_grad`` wrappers, in bulk
where the step is the usual one (see :func:`gradwatch.probe.judge.consume`).

A backward that calls the autograd engine without ``torch.autograd.backward`` (Megatron's
``custom_backward``), or through a reference to it taken before the watch started, gets no
marker of its own: its contributions are counted, as part of the backward before it.

Any internal error is logged once and the tracker turns itself off; training goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from gradwatch.probe import judge
from gradwatch.probe.names import Namer, positional
from gradwatch.probe.nocompile import no_compile
from gradwatch.probe.state import ArmedBackward, OptState, PreCheck
from gradwatch.wire import OptimizerInfo

log = logging.getLogger("gradwatch.probe")

_queue_callback = torch.autograd.Variable._execution_engine.queue_callback
_MAX_HITS = 1_000_000
"""Raw hits kept per optimizer before they are folded (backwards with no step nor reset),
checked every :data:`_CHECK_EVERY` backwards."""
_CHECK_EVERY = 1024


def _in_backward() -> bool:
    return bool(torch._C._current_graph_task_id() != -1)


class Tracker:
    """Tracks the optimizers of one watch session and produces step records."""

    __slots__ = ("on", "bw", "phase", "stepped_since_bw", "by_opt", "marks", "by_param",
                 "first", "observed", "handles", "armed", "emit", "norms_every", "namer",
                 "auto", "on_disable", "disabled", "steps", "_names_taken")

    def __init__(self, emit: Callable[[Any], None], *, norms_every: int = 1,
                 namer: Namer | None = None,
                 auto: bool = False, on_disable: Callable[[str], None] | None = None):
        self.on = True
        """False once turned off (an internal error, or closed)."""
        self.bw = 0
        self.phase = 0
        self.stepped_since_bw = False
        self.by_opt: dict[Any, OptState] = {}
        self.marks: list[Callable[[int], None]] = []
        """Each optimizer's ``incoming.append``: where a backward's marker goes."""
        self.by_param: dict[torch.Tensor, list[tuple[OptState, int]]] = {}
        self.first: dict[int, tuple[int, int]] = {}
        """Backward id -> (optimizer uid, phase) of the first step that consumed it."""
        self.observed: set[int] = set()
        """Backward ids whose contributions a GradScaler-skipped step looked at."""
        self.handles: list[RemovableHandle] = []
        self.armed: set[OptState] = set()
        """Optimizers whose consumed gradients no zero_grad has cleared yet."""
        self.emit = emit
        self.norms_every = norms_every
        self.namer = namer
        self.auto = auto
        self.on_disable = on_disable
        self.disabled: str | None = None
        self.steps = 0
        self._names_taken: set[str] = set()

    # ---------------------------------------------------------------- attach
    def attach(self, opt: torch.optim.Optimizer, name: str | None = None,
               instance_hooks: bool = True) -> OptState:
        """Start tracking ``opt``; returns its state (existing one if already tracked)."""
        st = self.by_opt.get(opt)
        if st is not None:
            return st
        params: list[torch.Tensor] = []
        groups: list[int] = []
        for gi, group in enumerate(opt.param_groups):
            for p in group["params"]:
                params.append(p)
                groups.append(gi)
        if name is None:
            name = f"{type(opt).__name__}#{len(self.by_opt)}"
        while name in self._names_taken:
            name += "'"
        self._names_taken.add(name)
        st = OptState(opt, len(self.by_opt), name, params, groups)
        self.by_opt[opt] = st
        self.marks.append(st.incoming.append)
        self._track(st, range(len(params)))
        st.instance_hooks = instance_hooks
        if instance_hooks:  # torch.compile must not trace into it
            self.handles.append(opt.register_step_pre_hook(no_compile(self.pre)))
        self._announce(st)
        return st

    def _track(self, st: OptState, ks: range) -> None:
        """Hook parameters ``ks`` of ``st``; gradient content they already hold is fresh for
        the next step, but never judged as discarded or late (we did not see its origin)."""
        for k in ks:
            p = st.params[k]
            self.by_param.setdefault(p, []).append((st, k))
            self._hook(st, k)
            if p.grad is not None:
                self.bw += 1
                st.new[k].append(self.bw)
                st.dirty = True
                self.observed.add(self.bw)

    def _announce(self, st: OptState) -> None:
        """Emit the optimizer's parameters (names, shapes, groups) as they are now."""
        names = (self.namer or positional)(st.params, st.groups)
        self.emit(OptimizerInfo(seq=0, t=time.time(), opt=st.name, cls=type(st.opt).__name__,
                                params=names, shapes=[list(p.shape) for p in st.params],
                                groups=list(st.groups)))

    def opt_add_param_group(self, opt: Any) -> None:
        """After ``Optimizer.add_param_group`` (progressive unfreezing): track the new
        parameters from now on, after the existing ones, and announce the longer list."""
        st = self.by_opt.get(opt)
        if st is None or not self.on:
            return
        try:
            known = set(st.params)
            added = [(gi, p) for gi, group in enumerate(opt.param_groups)
                     for p in group["params"] if p not in known]
            if not added:
                return
            n0 = len(st.params)
            st.add([p for _, p in added], [gi for gi, _ in added])
            self._track(st, range(n0, len(st.params)))
            self._announce(st)
        except Exception as e:  # noqa: BLE001
            self.fail(e)

    def _hook(self, st: OptState, k: int) -> None:
        p = st.params[k]
        if not p.requires_grad or p.grad_fn is not None:
            st.unhooked.append(k)
            return
        handle = p.register_post_accumulate_grad_hook(st.incoming.append)
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

    def begin(self) -> list[tuple[OptState, ArmedBackward]] | None:
        """A backward pass starts (the engine has not run yet): number it and mark it.

        Armed optimizers (their consumed gradients not cleared by zero_grad) also get their
        ``.grad`` state taken, returned for :meth:`end`; None when none is armed.
        """
        if not self.on:
            return None
        try:
            bw = self.bw = self.bw + 1
            if self.stepped_since_bw:
                self.phase += 1
                self.stepped_since_bw = False
            if not bw % _CHECK_EVERY:
                for st in self.by_opt.values():
                    if len(st.incoming) > _MAX_HITS:
                        st.sync()
            marker = -bw
            for mark in self.marks:
                mark(marker)
            if not self.armed:
                return None
            armed = []
            for st in self.armed:
                st.ensure_observed()
                st.pre_check = PreCheck.take(st, self.bw)
                seen = st.armed_bws[self.bw] = ArmedBackward(st.params)
                armed.append((st, seen))
            return armed
        except Exception as e:  # noqa: BLE001 - never raise into the training loop
            self.fail(e)
            return None

    def end(self, armed: list[tuple[OptState, ArmedBackward]]) -> None:
        """The engine returned (or raised): take the armed optimizers' gradients."""
        if not self.on:
            return
        try:
            for st, seen in armed:
                seen.done(st.params)
        except Exception as e:  # noqa: BLE001
            self.fail(e)

    # ---------------------------------------------------------------- step hooks
    def pre(self, opt: Any, args: Any, kwargs: Any) -> Any:
        """Optimizer step pre-hook: consume the gradients (or wrap the closure)."""
        if not self.on:
            return None
        try:
            st = self.by_opt.get(opt)
            if st is None:
                if not self.auto:
                    return None
                st = self.attach(opt, instance_hooks=False)
            if st.unhooked:
                pending, st.unhooked = st.unhooked, []
                for k in pending:
                    self._hook(st, k)
            # torch passes the step's own args, ``self`` first: (self, closure?)
            closure = args[1] if len(args) > 1 else kwargs.get("closure")
            if callable(closure):
                st.in_step = True
                if st.instance_hooks and not st.post_hooked:
                    # registered now, it still runs after this very step
                    st.post_hooked = True
                    self.handles.append(st.opt.register_step_post_hook(
                        no_compile(self.post)))
                wrapped = self._wrap_closure(st, closure)
                if len(args) > 1:
                    return (args[0], wrapped, *args[2:]), kwargs
                return args, {**kwargs, "closure": wrapped}
            # Without a closure the step reads its gradients now and nothing after:
            # the record is complete at step entry (no post-hook call per step).
            self.emit(judge.plain_step(self, st))
            self.steps += 1
        except Exception as e:  # noqa: BLE001
            self.fail(e)
        return None

    def post(self, opt: Any, args: Any, kwargs: Any) -> None:
        """Optimizer step post-hook (closure steps): emit the step record."""
        if not self.on:
            return
        try:
            st = self.by_opt.get(opt)
            if st is None or not st.in_step:
                return
            self.emit(judge.finalize(self, st, skipped=False))
            self.steps += 1
        except Exception as e:  # noqa: BLE001
            self.fail(e)

    def _wrap_closure(self, st: OptState, closure: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*a: Any, **kw: Any) -> Any:
            out = closure(*a, **kw)
            if self.on:
                try:
                    judge.consume(self, st, closure=True)
                except Exception as e:  # noqa: BLE001
                    self.fail(e)
            return out

        return wrapped

    # ---------------------------------------------------------------- reset signals
    def opt_zero_grad(self, opt: Any) -> None:
        """After ``Optimizer.zero_grad``: every parameter of ``opt`` was reset."""
        st = self.by_opt.get(opt)
        if st is None or not self.on:
            return
        try:
            st.reset_all("optimizer_zero_grad")
            st.drop_observed()
            st.armed = False
            self.armed.discard(st)
        except Exception as e:  # noqa: BLE001
            self.fail(e)

    def module_zero_grad(self, module: torch.nn.Module) -> None:
        """After ``Module.zero_grad``: the module's parameters were reset."""
        if not self.on or not self.by_param:
            return
        try:
            covered: dict[OptState, list[int]] = {}
            for p in module.parameters():
                for st, k in self.by_param.get(p, ()):
                    covered.setdefault(st, []).append(k)
            for st, ks in covered.items():
                st.sync()
                st.sync_old()
                for k in ks:
                    if st.old[k] or st.new[k]:
                        st.reset(k, "module_zero_grad")
                st.pending.append(("module_zero_grad", [], [], ()))
                if len(ks) >= len(st.params):
                    st.drop_observed()
                    st.armed = False
                    self.armed.discard(st)
        except Exception as e:  # noqa: BLE001
            self.fail(e)

    def scaler_before(self, opt: Any) -> tuple[OptState, int] | None:
        st = self.by_opt.get(opt)
        if st is None and self.auto and self.on and isinstance(
                opt, torch.optim.Optimizer):
            st = self.attach(opt, instance_hooks=False)
        return None if st is None else (st, st.step)

    def scaler_after(self, token: tuple[OptState, int] | None) -> None:
        """After ``GradScaler.step``: if the optimizer did not step, record a skipped step."""
        if token is None or not self.on:
            return
        st, before = token
        if st.step != before:
            return
        try:
            judge.observe_skip(self, st)
            self.emit(judge.finalize(self, st, skipped=True))
            self.steps += 1
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
        for h in self.handles:
            h.remove()
        self.handles.clear()
        if not self.on:  # what the hooks appended since the probe turned off
            for st in self.by_opt.values():
                st.incoming.clear()

    def close(self) -> None:
        self.remove_hooks()
        self.on = False
        for st in self.by_opt.values():
            st.incoming.clear()
            st.hits.clear()
