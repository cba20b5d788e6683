"""Which leaf tensors a backward pass reaches: a walk of its autograd graph, sampled.

Thread: training (the wrapper of ``torch.autograd.backward`` draws one of :data:`ticks`
per backward, and calls :func:`walk` on the sampled ones, before the engine runs).

A backward accumulates into the ``.grad`` of each leaf its graph reaches: the ``variable`` of
every ``AccumulateGrad`` node under the roots' ``grad_fn``. Walking a graph costs a Python step
per node, so only some backwards are walked: the first :data:`FIRST` of a session (where a
script's set-up shows), then every :data:`EVERY`-th (where later changes show). A session that
starts restarts the schedule (:func:`restart`). Nothing here reads a device value: the walk
only follows graph nodes.

A backward that runs inside another one (reentrant checkpointing) is not walked: leaves
reached only inside such a segment are not found.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from gradwatch.probe.tracker import Tracker

FIRST = 3
"""The first backwards of a session, all walked."""
EVERY = 64
"""After those, one backward in this many is walked."""
_MAX_NODES = 200_000
"""Graph nodes visited at most per walk (a larger graph's other leaves wait for another)."""

ticks = itertools.count(1)
"""Numbers the backwards of the session (``next(ticks)``, a C call: no frame per backward)."""
walk_at = 1
"""The number of the next backward to walk: the backward wrapper draws a tick per backward
and, when it equals this, calls :func:`walk`, which sets the next."""


def restart() -> None:
    """A session starts: sample its first backwards again."""
    global ticks, walk_at
    ticks, walk_at = itertools.count(1), 1


def walk(trackers: Sequence[Tracker], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Walk the graph of the backward called with ``args``/``kwargs`` (those of
    ``torch.autograd.backward``), the one just counted (``next(ticks) == walk_at``), and
    hand its leaves to each tracker."""
    global walk_at
    c = walk_at
    walk_at = c + 1 if c < FIRST else (c // EVERY + 1) * EVERY
    try:
        found = leaves(_tensors(args[0] if args else kwargs.get("tensors")),
                       args[5] if len(args) > 5 else kwargs.get("inputs"))
    except Exception as e:  # noqa: BLE001 - never raise into the training loop
        for t in trackers:
            t.fail(e)
        return
    for t in trackers:
        t.reached(found)


def leaves(roots: Iterable[torch.Tensor], inputs: Any = None) -> list[torch.Tensor]:
    """The leaf tensors whose ``.grad`` a backward from ``roots`` writes (only those among
    ``inputs`` when given, as ``backward(inputs=...)`` does)."""
    if inputs is not None:
        return [t for t in _tensors(inputs) if t.requires_grad and t.grad_fn is None]
    out: list[torch.Tensor] = []
    stack: list[Any] = []  # graph nodes (torch types them loosely)
    for r in roots:
        if r.grad_fn is not None:
            stack.append(r.grad_fn)
        elif r.requires_grad:
            out.append(r)  # a leaf as the root: backward() writes its own .grad
    seen: set[Any] = set()
    visited = 0
    accumulate: Any = _accumulate_grad_type()
    while stack and visited < _MAX_NODES:
        node = stack.pop()
        visited += 1
        for nxt, _ in node.next_functions:
            if nxt is None or nxt in seen:
                continue
            seen.add(nxt)
            if type(nxt) is accumulate:  # (a type check: getattr would raise on the others)
                out.append(nxt.variable)
            else:
                stack.append(nxt)
    out.reverse()  # the depth-first walk meets the output side first: inputs' side first
    return out


_ACCUMULATE: list[type] = []


def _accumulate_grad_type() -> type:
    """The class of the graph node that accumulates into a leaf's ``.grad``."""
    if not _ACCUMULATE:
        node: Any = torch.zeros(1, requires_grad=True).expand(1).grad_fn
        _ACCUMULATE.append(type(node.next_functions[0][0]))
    return _ACCUMULATE[0]


def _tensors(x: Any) -> list[torch.Tensor]:
    if x is None:
        return []
    if isinstance(x, torch.Tensor):
        return [x]
    return [t for t in x if isinstance(t, torch.Tensor)]
