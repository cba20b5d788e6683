"""Parameter names for ``OptimizerInfo``: from the model, from the live modules, or unnamed.

Thread: training (once per optimizer, when it is attached or gains parameters).

With ``model=`` the names are ``model.named_parameters()`` names. Under ``gradwatch run``
the probe does not know the model, so at attach time it looks once (via ``gc``) for the
root modules that own the optimizer's parameters; when several root modules hold
parameters (a GAN's generator and discriminator) names get the root's class name as a
prefix. A parameter with no such name is named by :func:`unnamed`.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence

import torch

Namer = Callable[[Sequence[torch.Tensor], Sequence[int]], list[str]]
"""``namer(params, groups) -> names``: one name per parameter, ``groups[k]`` being
parameter ``k``'s param group."""


def unnamed(groups: Sequence[int] | None, n: int) -> list[str]:
    """Names for ``n`` parameters that have none: ``group{g}.param{i}``, the ``i``-th
    parameter of param group ``g``; ``param{i}``, the ``i``-th of all, where the groups are
    not known (``groups`` None)."""
    if groups is None:
        return [f"param{i}" for i in range(n)]
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
    :func:`unnamed` for the rest)."""
    wanted = set(params)
    # type(), not isinstance(): isinstance() reads __class__, which raises ReferenceError
    # on a dead weakref.proxy and warns on lazy module proxies found in gc.
    module_t = torch.nn.Module
    modules = [o for o in gc.get_objects() if issubclass(type(o), module_t)]
    children: set[int] = set()
    for m in modules:
        for c in m.children():
            children.add(id(c))
    owners: list[tuple[torch.nn.Module, dict[torch.Tensor, str]]] = []
    roots_with_params = 0
    for m in modules:
        if id(m) in children:
            continue
        named = list(m.named_parameters(remove_duplicate=False))
        roots_with_params += bool(named)
        table: dict[torch.Tensor, str] = {p: n for n, p in named if p in wanted}
        if table:
            owners.append((m, table))
    owners.sort(key=lambda o: -len(o[1]))
    prefix = roots_with_params > 1
    merged: dict[torch.Tensor, str] = {}
    for m, table in owners:
        for p, n in table.items():
            merged.setdefault(p, f"{type(m).__name__}.{n}" if prefix else n)
    return _named(params, groups, merged)


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
