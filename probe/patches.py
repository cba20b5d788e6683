"""Class-level wrappers shared by every open watch session, installed while one is open.

There is no zero_grad hook in PyTorch and GradScaler skips ``optimizer.step()`` without a
hook firing, so while a session is open ``Optimizer.zero_grad``, ``Module.zero_grad`` and
``GradScaler.step`` are wrapped (extra signals that label resets and see skipped steps;
the truth stays the state of ``.grad``), and ``Optimizer.add_param_group`` too, so that
parameters added later (progressive unfreezing) are tracked. ``torch.autograd.backward``
(which ``Tensor.backward`` calls) is wrapped to mark where each backward pass starts, once
per backward instead of a check in every parameter's hook, and on sampled backwards to walk
their graphs (:mod:`gradwatch.probe.reach`). In ``gradwatch run`` mode
``Optimizer.__init__`` is wrapped too, to attach to each optimizer the script creates, and
each session hooks every optimizer's steps (torch's global step hooks). The last session to
close restores the originals.

Thread: training (the wrappers run where the user calls them; registering is locked).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from gradwatch.probe import reach
from gradwatch.probe.losses import UNSCALED
from gradwatch.probe.nocompile import no_compile, skip_tracing

if TYPE_CHECKING:
    from gradwatch.probe.tracker import Tracker

log = logging.getLogger("gradwatch.probe")

_lock = threading.Lock()
_active: tuple[Tracker, ...] = ()
_auto: tuple[Tracker, ...] = ()
"""Open sessions (``_auto``: those of ``gradwatch run``). Tuples, replaced whole under
``_lock``: a wrapper iterates the one it read, with no copy per call."""
_saved: list[tuple[Any, str, Any]] = []


def _scaler_classes() -> list[type]:
    out: list[type] = []
    amp = getattr(torch, "amp", None)
    if amp is not None and hasattr(amp, "GradScaler"):
        out.append(amp.GradScaler)
    try:
        from torch.cuda.amp import GradScaler as CudaScaler

        if "step" in CudaScaler.__dict__:
            out.append(CudaScaler)
    except ImportError:  # pragma: no cover - torch without CUDA amp module
        pass
    return out


def _wrap(owner: Any, attr: str, make: Callable[[Any], Any]) -> None:
    orig = owner.__dict__[attr]
    _saved.append((owner, attr, orig))
    wrapper = make(orig)
    wrapper.__gradwatch_original__ = orig
    setattr(owner, attr, wrapper)


def _after(notify: str) -> Callable[[Any], Any]:
    """A wrapper factory: run the original, then tell every open tracker (``notify``)."""

    def make(orig: Any) -> Any:
        @functools.wraps(orig)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            out = orig(self, *args, **kwargs)
            for t in _active:
                getattr(t, notify)(self)
            return out

        return wrapper

    return make


def _make_scaler_scale(orig: Any) -> Any:
    @functools.wraps(orig)
    def scale(self: Any, outputs: Any, *args: Any, **kwargs: Any) -> Any:
        out = orig(self, outputs, *args, **kwargs)
        if out is not outputs and isinstance(out, torch.Tensor):
            for t in _active:  # their backward wrapper looks for the tag from now on
                t.roots.scaled = True
            try:  # the loss as the user made it, before scaling (probe/losses.py)
                setattr(out, UNSCALED, outputs)
            except Exception:  # noqa: BLE001 - a tensor subclass that refuses attributes
                log.debug("cannot tag a scaled loss", exc_info=True)
        return out

    return scale


def _make_scaler_step(orig: Any) -> Any:
    @functools.wraps(orig)
    def step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        tokens = []
        for t in _active:
            try:
                tokens.append((t, t.scaler_before(optimizer)))
            except Exception as e:  # noqa: BLE001
                t.fail(e)
        out = orig(self, optimizer, *args, **kwargs)
        for t, tok in tokens:
            t.scaler_after(tok)
        return out

    return step


_graph_task_id = torch._C._current_graph_task_id


def _roots(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The ``tensors`` of ``torch.autograd.backward(tensors, grad_tensors, retain_graph,
    create_graph, ...)``; None when the graph is retained (its saved tensors must not be held
    longer than the user holds them)."""
    retain = args[2] if len(args) > 2 else kwargs.get("retain_graph")
    create = args[3] if len(args) > 3 else kwargs.get("create_graph", False)
    if retain or (retain is None and create):
        return None
    return args[0] if args else kwargs.get("tensors")


def _make_backward(orig: Any) -> Any:
    def backward(*args: Any, **kwargs: Any) -> Any:
        active = _active
        if not active or _graph_task_id() != -1:  # nested: part of the running backward
            return orig(*args, **kwargs)
        if next(reach.ticks) == reach.walk_at:  # (a C call, no frame: once a backward)
            reach.walk(active, args, kwargs)  # sampled: the leaves it writes grads to
        armed = None  # a list only when some tracker is armed (no list per backward)
        if len(args) == 4 and not args[2] and not args[3]:
            # ``Tensor.backward()``'s own call (tensors, gradient, retain_graph,
            # create_graph), the graph not kept: :func:`_roots` without its frame
            roots = tensors = args[0]
        else:
            roots = _roots(args, kwargs)
            tensors = args[0] if args else kwargs.get("tensors")
        for t in active:
            if (a := t.begin(roots, tensors)) is not None:
                if armed is None:
                    armed = []
                armed.append((t, a))
        if armed is None:  # nothing armed (the usual case): nothing to take after the engine
            return orig(*args, **kwargs)
        try:
            return orig(*args, **kwargs)
        finally:
            for t, a in armed:
                t.end(a)

    functools.update_wrapper(backward, orig)
    return skip_tracing(backward, "gradwatch's backward marker")


def _make_opt_init(orig: Any) -> Any:
    @functools.wraps(orig)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        orig(self, *args, **kwargs)
        for t in _auto:
            if t.on:
                try:
                    t.attach(self, instance_hooks=False)
                except Exception as e:  # noqa: BLE001
                    t.fail(e)

    return __init__


_global_handles: dict[Tracker, list[Any]] = {}
"""Per ``gradwatch run`` session: its global step pre-hook, then its post-hook once it has
seen a closure step (:func:`need_post`). A session's own hooks, not one shared hook that
loops over the sessions: torch chains the pre-hooks' ``(args, kwargs)`` itself, and the
usual step, with no closure, then runs one hook and no post-hook at all."""


def _install() -> None:
    _wrap(torch.optim.Optimizer, "zero_grad", _after("opt_zero_grad"))
    _wrap(torch.nn.Module, "zero_grad", _after("module_zero_grad"))
    _wrap(torch.optim.Optimizer, "add_param_group", _after("opt_add_param_group"))
    _wrap(torch.autograd, "backward", _make_backward)
    for cls in _scaler_classes():
        _wrap(cls, "step", _make_scaler_step)
        if "scale" in cls.__dict__:
            _wrap(cls, "scale", _make_scaler_scale)


def _install_auto() -> None:
    _wrap(torch.optim.Optimizer, "__init__", _make_opt_init)


def _hook_steps(tracker: Tracker) -> None:
    """Every optimizer's steps call ``tracker.pre`` (torch.compile must not trace into it)."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    _global_handles[tracker] = [register_optimizer_step_pre_hook(no_compile(tracker.pre))]


def need_post(tracker: Tracker) -> None:
    """A ``gradwatch run`` session met a closure step (in its pre-hook): give it a global
    step post-hook, which runs after that very step (torch reads the post-hooks once the
    step returns), to hand the step's facts over. Once per session; nothing for others."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    with _lock:
        handles = _global_handles.get(tracker)
        if handles is not None and len(handles) == 1:
            handles.append(register_optimizer_step_post_hook(no_compile(tracker.post)))


def _restore(which: Callable[[Any, str], bool]) -> None:
    keep = []
    for owner, attr, orig in reversed(_saved):
        if which(owner, attr):
            setattr(owner, attr, orig)
        else:
            keep.append((owner, attr, orig))
    _saved[:] = list(reversed(keep))


def register(tracker: Tracker, auto: bool = False) -> None:
    """Route the wrappers' signals to ``tracker`` (installing them if needed)."""
    global _active, _auto
    with _lock:
        if not _active:
            _install()
        reach.restart()  # a new session samples its first backwards
        _active = (*_active, tracker)
        if auto:
            if not _auto:
                _install_auto()
            _auto = (*_auto, tracker)
            _hook_steps(tracker)


def unregister(tracker: Tracker) -> None:
    """Stop routing to ``tracker``; the last one out restores the originals."""
    global _active, _auto
    with _lock:
        if tracker in _auto:
            _auto = tuple(t for t in _auto if t is not tracker)
            for h in _global_handles.pop(tracker, ()):
                h.remove()
            if not _auto:
                _restore(lambda owner, attr: attr == "__init__")
        if tracker in _active:
            _active = tuple(t for t in _active if t is not tracker)
            if not _active:
                _restore(lambda owner, attr: True)
