"""Names people recognise for ``OptimizerInfo``: parameter names, and the optimizer's label.

Thread: training (once per optimizer, when it is attached or gains parameters).

With ``model=`` the names are ``model.named_parameters()`` names. Under ``gradwatch run``
the probe does not know the model, so at attach time it looks at the variables of the
calling frames (:func:`from_frames`: locals, globals, and the attributes of ``self``-like
objects there) for the root modules that own the optimizer's parameters, and only where
that finds none, in memory (:func:`from_live_modules`, a ``gc`` walk). When several root
modules hold parameters (a GAN's generator and discriminator) names get the root's variable
name as a prefix (``dec.0.weight``; the class name where no variable holds it); in memory,
only when the optimizer's own parameters span several roots, since memory also holds what
earlier code left alive. A parameter with no such name is named by :func:`unnamed`.

An optimizer's label (:func:`optimizer_label`) is the variable its creator stores it in,
read from the bytecode right after the constructor call (the variable is not bound yet while
the constructor runs), else the variable that holds it in the calling frame. Given an
optimizer that already exists (``watch(opt)``, or its first ``step()``), its label is what
holds it in the calling frame (:func:`held_label`): a variable (``opt``), else an attribute
of an object held there (``self.opt``).
"""

from __future__ import annotations

import dis
import gc
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from gradwatch.probe.sites import OUR_USERS
from gradwatch.probe.watchargs import unwrap
from gradwatch.wire import unnamed_param

Namer = Callable[[Sequence[torch.Tensor], Sequence[int]], list[str]]
"""``namer(params, groups) -> names``: one name per parameter, ``groups[k]`` being
parameter ``k``'s param group."""


def unnamed(groups: Sequence[int] | None, n: int) -> list[str]:
    """Names for ``n`` parameters that have none: ``group{g}.param{i}``, the ``i``-th
    parameter of param group ``g``; ``param{i}``, the ``i``-th of all, where the groups are
    not known (``groups`` None)."""
    if groups is None:
        return [unnamed_param(i) for i in range(n)]
    seen: dict[int, int] = {}
    out = []
    for g in groups:
        i = seen.get(g, 0)
        seen[g] = i + 1
        out.append(f"group{g}.param{i}")
    return out


def positional(params: Sequence[torch.Tensor], groups: Sequence[int]) -> list[str]:
    """The namer without a model: every parameter :func:`unnamed`."""
    return unnamed(groups, len(params))


def from_model(model: torch.nn.Module) -> Namer:
    """A namer using ``model.named_parameters()`` (:func:`unnamed` for the rest)."""
    table: dict[torch.Tensor, str] = {
        p: n for n, p in model.named_parameters(remove_duplicate=False)}
    return lambda params, groups: _named(params, groups, table)


def from_live_modules(params: Sequence[torch.Tensor],
                      groups: Sequence[int] | None = None) -> list[str]:
    """Names from the root modules found in memory that own ``params`` (a :data:`Namer`;
    :func:`unnamed` for the rest), prefixed by the root's class name where several roots
    hold parameters."""
    return _named(params, groups, _live_table(params))


def _live_table(params: Sequence[torch.Tensor]) -> dict[torch.Tensor, str]:
    # type(), not isinstance(): isinstance() reads __class__, which raises ReferenceError
    # on a dead weakref.proxy and warns on lazy module proxies found in gc.
    module_t = torch.nn.Module
    modules = [o for o in gc.get_objects() if issubclass(type(o), module_t)]
    children = {id(c) for m in modules for c in m.children()}
    roots = [(m, type(m).__name__) for m in modules if id(m) not in children]
    # Memory holds whatever earlier code left alive: only roots owning these parameters
    # may decide the prefix, or a name would depend on unrelated garbage.
    return _root_names(params, roots, among_owners=True)


_SKIP_PREFIXES = ("gradwatch.", "torch.")
_FRAMEWORK_PREFIXES = (*_SKIP_PREFIXES, "lightning.", "pytorch_lightning.",
                       "lightning_fabric.", "transformers.", "accelerate.")
"""Also the frameworks that step an optimizer for the user: their variables are not the
user's names for it."""


def _user_frames(start: types.FrameType | None,
                 skip: tuple[str, ...] = _SKIP_PREFIXES) -> Iterator[types.FrameType]:
    """Frames from ``start`` outwards, without gradwatch's and torch's own (and ``skip``'s);
    gradwatch's own training code (the demo's loop, :data:`~gradwatch.probe.sites.OUR_USERS`)
    is the user's."""
    f = start
    while f is not None:
        name = str(f.f_globals.get("__name__", ""))
        if not name.startswith(skip) or name in OUR_USERS:
            yield f
        f = f.f_back


def _variables(frames: Sequence[types.FrameType]) -> Iterator[tuple[str, Any]]:
    """``(name, value)`` of the frames' locals (innermost first), then of their globals,
    then of the attributes of plain objects held in locals (``self.model``)."""
    scopes: list[dict[str, Any]] = [f.f_locals for f in frames]
    seen = {id(d) for d in scopes}
    for f in frames:
        if id(f.f_globals) not in seen:
            seen.add(id(f.f_globals))
            scopes.append(f.f_globals)
    for d in scopes:
        yield from list(d.items())
    skip = (type, types.ModuleType, types.FunctionType, torch.nn.Module)
    for f in frames:
        for v in list(f.f_locals.values()):
            attrs = _attributes(v, skip)
            if attrs is not None:
                yield from list(attrs.items())


def from_frames(params: Sequence[torch.Tensor],
                groups: Sequence[int] | None = None) -> list[str]:
    """Names from the root modules (and the tensors) held in variables of the calling
    frames (a :data:`Namer`); where a parameter has none, :func:`from_live_modules`."""
    module_t, tensor_t = torch.nn.Module, torch.Tensor
    wanted = set(params)
    frames = list(_user_frames(sys._getframe(1)))
    found: dict[int, tuple[str, torch.nn.Module]] = {}
    direct: dict[torch.Tensor, str] = {}
    for name, v in _variables(frames):
        if name.startswith("_"):
            continue
        # type(), not isinstance(): see from_live_modules
        t = type(v)
        if issubclass(t, module_t):
            found.setdefault(id(v), (name, v))
        elif issubclass(t, tensor_t) and v in wanted:
            direct.setdefault(v, name)
    inner: set[int] = set()
    for _, m in found.values():
        inner.update(id(c) for c in m.modules() if c is not m)
    roots: list[tuple[torch.nn.Module, str]] = []
    labels: set[str] = set()
    for i, (name, m) in found.items():
        if i not in inner:
            label = name if name not in labels else type(m).__name__
            labels.add(label)
            roots.append((m, label))
    table = _root_names(params, roots)
    for p, name in direct.items():
        table.setdefault(p, name)
    if len(table) < len(wanted):
        for p, name in _live_table(params).items():
            table.setdefault(p, name)
    return _named(params, groups, table)


def _root_names(params: Sequence[torch.Tensor], roots: Sequence[tuple[torch.nn.Module, str]],
                among_owners: bool = False) -> dict[torch.Tensor, str]:
    """Names of ``params`` under the given roots (``(module, label)``), prefixed by the
    root's label when more than one root holds parameters (``among_owners``: more than one
    root holds some of ``params``)."""
    wanted = set(params)
    owners: list[tuple[str, dict[torch.Tensor, str]]] = []
    roots_with_params = 0
    for m, label in roots:
        named = list(m.named_parameters(remove_duplicate=False))
        roots_with_params += bool(named)
        mine: dict[torch.Tensor, str] = {p: n for n, p in named if p in wanted}
        if mine:
            owners.append((label, mine))
    owners.sort(key=lambda o: -len(o[1]))
    prefix = (len(owners) if among_owners else roots_with_params) > 1
    merged: dict[torch.Tensor, str] = {}
    for label, mine in owners:
        for p, n in mine.items():
            merged.setdefault(p, f"{label}.{n}" if prefix else n)
    return merged


_LOADS = frozenset({"LOAD_FAST", "LOAD_NAME", "LOAD_GLOBAL", "LOAD_DEREF",
                    "LOAD_FAST_CHECK", "LOAD_FAST_BORROW"})


def _stored_into(frame: types.FrameType) -> str | None:
    """The target the value of the call ``frame`` is making is stored into, read from the
    instructions after it: ``opt`` (``opt = ...``, ``self.opt = ...``) or ``opts['g']``
    (``self.opts['g'] = ...``); None for anything else."""
    ins = [i for i in dis.get_instructions(frame.f_code) if i.offset > frame.f_lasti][:8]
    if not ins:
        return None
    first = ins[0]
    if first.opname.startswith("STORE_") and first.opname not in ("STORE_SUBSCR",
                                                                  "STORE_ATTR"):
        return str(first.argval)
    if first.opname not in _LOADS:
        return None
    last = str(first.argval)
    for i, x in enumerate(ins[1:], start=1):
        if x.opname == "LOAD_ATTR":
            last = str(x.argval)
        elif x.opname == "STORE_ATTR":
            return str(x.argval)
        elif (x.opname == "LOAD_CONST" and i + 1 < len(ins)
              and ins[i + 1].opname == "STORE_SUBSCR"):
            return f"{last}[{x.argval!r}]"
        else:
            return None
    return None


def optimizer_label(opt: torch.optim.Optimizer) -> str | None:
    """What the user's code calls ``opt`` (see the module docstring), or None.

    Called while ``opt`` is being attached: in its constructor (``gradwatch run``), or at
    its first step.
    """
    try:
        return _label(opt, sys._getframe(1))
    except Exception:  # noqa: BLE001 - an odd frame or code object only costs the label
        return None


def _label(opt: torch.optim.Optimizer, start: types.FrameType) -> str | None:
    for f in _user_frames(start):
        if f.f_code.co_name == "__init__" and f.f_locals.get("self") is opt:
            continue  # a subclass's constructor: its caller stores the result
        return _stored_into(f) or _held_in(opt, f)
    return None


def held_label(opt: torch.optim.Optimizer) -> str | None:
    """What the calling frame (the first outside gradwatch and torch) holds ``opt`` as, or a
    wrapper of it (Accelerate's): a variable (``opt``), else an attribute of an object one
    holds (``self.opt``); None when nothing there holds it."""
    try:
        frame = next(_user_frames(sys._getframe(1), _FRAMEWORK_PREFIXES), None)
        return None if frame is None else _held_in(opt, frame)
    except Exception:  # noqa: BLE001 - an odd frame only costs the label
        return None


def _held_in(opt: torch.optim.Optimizer, f: types.FrameType) -> str | None:
    def holds(v: Any) -> bool:
        # a wrapper (Accelerate's, Lightning's) derives from torch's Optimizer too;
        # type(): see from_live_modules
        return v is opt or (issubclass(type(v), torch.optim.Optimizer) and unwrap(v) is opt)

    for scope in (f.f_locals, f.f_globals):
        for k, v in list(scope.items()):
            if not k.startswith("_") and holds(v):
                return str(k)
    skip = (type, types.ModuleType, types.FunctionType, torch.optim.Optimizer)
    for k, v in list(f.f_locals.items()):
        attrs = None if k.startswith("_") else _attributes(v, skip)
        if attrs is not None:
            for a, x in list(attrs.items()):
                if not a.startswith("_") and holds(x):
                    return f"{k}.{a}"
    return None


def _attributes(v: object, skip: tuple[type, ...]) -> dict[str, Any] | None:
    """``v``'s instance attributes, or None for a ``skip`` type or an object without them.
    type(), not isinstance() nor getattr(): a dead weakref.proxy raises on both."""
    if issubclass(type(v), skip) or type(v).__module__ == "weakref":
        return None
    try:
        attrs = object.__getattribute__(v, "__dict__")
    except (AttributeError, TypeError, ReferenceError):
        return None
    return attrs if type(attrs) is dict else None


def _named(params: Sequence[torch.Tensor], groups: Sequence[int] | None,
           table: dict[torch.Tensor, str]) -> list[str]:
    fallback = unnamed(groups, len(params))
    return [table.get(p, fallback[k]) for k, p in enumerate(params)]


def owners(params: Sequence[torch.Tensor]) -> list[int]:
    """For each parameter, an id of the live module that holds it directly (in its own
    ``_parameters``; a layer), or -1: which parameters make up one layer. Looks through
    ``gc`` once per call (rare: see :mod:`gradwatch.probe.deliberate`)."""
    wanted = {id(p): k for k, p in enumerate(params)}
    out = [-1] * len(params)
    module_t = torch.nn.Module
    for m in gc.get_objects():
        if not issubclass(type(m), module_t):  # type(): see from_live_modules
            continue
        for p in m.__dict__.get("_parameters", {}).values():
            k = wanted.get(id(p))
            if k is not None and p is params[k] and out[k] == -1:
                out[k] = id(m)
    return out
