"""Correct algorithms that throw gradients away on purpose, told from the bugs they look like.

Thread: training (through a ledger, and the tracker's backward wrapper).

In gradient bookkeeping alone these look like reset bugs (backward, reset, backward, step is
also a reset inside an accumulation window). What else happens tells them apart:

- *Used by an update* (sharpness-aware minimisation): the first gradient was read to move the
  parameters in place (``p.add_(e_w)``), by no optimizer step, before the reset. Seen as the
  versions of the parameters whose contributions the reset removed having moved since the
  phase began (the first backward after a step), on a sample of the optimizer's parameters
  spread over its list.
- *An attack's backward* (FGSM, PGD): that backward also wrote a gradient into a leaf tensor
  that is no parameter (the input perturbation), found by walking its graph.
- *Gradient surgery* (PCGrad): the gradient the step read was written by hand after the
  backwards: other ``.grad`` objects than the last backward left.
- *Loss surgery through one retained graph* (actor-critic): a backward with
  ``retain_graph=True``, a reset of the parameters the next backward refills (the critic's,
  removing the actor loss's share), that next backward through the same graph, one step.
  Seen as the second backward's graph running through a node of the first's (not merely a
  parameter's: separate forwards share those), and every parameter the reset emptied
  refilled before the step; a reset between micro-batches of separate forwards stays a bug.
- *A per-layer freeze* (DINO's ``cancel_gradients_last_layer``): resets of some parameters
  only (not an optimizer's ``zero_grad``) left whole layers with nothing before the step,
  while the rest stepped on fresh gradients. Half a layer dropped is still a late reset.

The first two are judged when the reset's removal is seen, the last three at the step. All run
only when a reset threw contributions away, except the version snapshot each phase (at most
:data:`_SAMPLE` reads a step, whatever the model's size).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from operator import attrgetter
from typing import Any

import torch

from gradwatch.probe.names import owners
from gradwatch.probe.shards import GradReader, local

_SAMPLE = 32
"""Parameters whose versions are taken when a phase begins (spread over the list)."""
_version = attrgetter("_version")
_MAX_NODES = 100_000
"""Graph nodes walked at most when looking for an attack's input leaf."""


class Deliberate:
    """What one optimizer's ledger needs to tell a deliberate discard from a bug."""

    __slots__ = ("params", "sample", "sampled", "versions", "left", "owner", "reader")

    def __init__(self, params: list[torch.Tensor], reader: GradReader) -> None:
        self.params = params
        """The ledger's own list (parameters added later are appended to it)."""
        self.reader = reader
        self.sample: list[int] = []
        self.sampled: list[torch.Tensor] = []
        """The :attr:`sample` parameters themselves (read each phase: no indexing then)."""
        self.versions: list[int] = []
        """The versions of the :attr:`sample` parameters when the phase began."""
        self.left: list[torch.Tensor | None] | None = None
        """The gradients the last backward left, while a lost contribution awaits the step
        (held: an id could be reused by the gradient written in its place)."""
        self.owner: list[int] | None = None
        self.replan()

    def replan(self) -> None:
        """Parameters were added: spread the sample over them all."""
        n = len(self.params)
        last = min(n, _SAMPLE) - 1
        self.sample = sorted({round(i * (n - 1) / last) for i in range(last + 1)}
                             if last > 0 else range(n))
        self.sampled = [self.params[k] for k in self.sample]
        self.phase_began()

    def phase_began(self) -> None:
        """The first backward after a step starts: take the sampled parameters' versions."""
        sampled = self.sampled
        if self.reader.sharded:  # a DTensor's version is its local shard's
            sampled = [local(p) for p in sampled]
        self.versions = list(map(_version, sampled))

    def moved(self, ks: Collection[int]) -> bool:
        """Whether the parameters of ``ks`` were changed in place since the phase began:
        every sampled one among them (at least one)."""
        params, versions = self.params, self.versions
        got = [(k, v) for k, v in zip(self.sample, versions, strict=True) if k in ks]
        return bool(got) and all(local(params[k])._version != v for k, v in got)

    def backward_left(self) -> None:
        """A backward returned while a lost contribution awaits the step: take the
        gradients it left."""
        self.left = self.reader.grads(self.params)

    def handwritten(self, grads: Sequence[torch.Tensor | None], ks: Iterable[int]) -> bool:
        """Whether the step reads, for every parameter of ``ks`` that has a gradient (at
        least one), another ``.grad`` than the last backward left."""
        left = self.left
        if left is None:
            return False
        some = False
        for k in ks:
            g = grads[k]
            if g is None:
                continue
            if k >= len(left) or left[k] is g:
                return False
            some = True
        return some

    def frozen_layers(self, late: Collection[int], fresh: Collection[int]) -> bool:
        """Whether the parameters left with nothing fresh (``late``) are whole layers, while
        others (``fresh``) stepped on fresh gradients: each layer with a late parameter has
        all of its parameters that got a contribution in ``late``."""
        if not late or not fresh:
            return False
        if self.owner is None or len(self.owner) != len(self.params):
            self.owner = owners(self.params)
        owner = self.owner
        layers = {owner[k] for k in late}
        return -1 not in layers and not any(owner[k] in layers for k in fresh)

    def forget(self) -> None:
        """The step was judged."""
        self.left = None


def wrote_input_grad(roots: Any, held: Mapping[Any, Any]) -> bool:
    """Whether the backward from ``roots`` accumulated a gradient into a leaf tensor that is
    neither an ``nn.Parameter`` nor held by a watched optimizer (an attack's perturbation)."""
    todo = [t.grad_fn for t in tensors_of(roots)]
    seen: set[Any] = set()
    while todo and len(seen) < _MAX_NODES:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        var = getattr(fn, "variable", None)  # an AccumulateGrad node: its leaf
        if var is not None:
            if not isinstance(var, torch.nn.Parameter) and var not in held:
                return True
            continue
        todo.extend(f for f, _ in fn.next_functions)
    return False


def shares_graph(first: Any, second: Any) -> bool:
    """Whether the graph from ``second`` runs through a node of the graph from ``first``
    other than a parameter's (two backwards from one forward's graph, the first retained:
    separate forwards of one model share only their leaves' ``AccumulateGrad`` nodes)."""
    return _nodes(second, _nodes(first)) is None


def _nodes(roots: Any, stop: set[Any] | None = None) -> set[Any] | None:
    """The nodes of the graph from ``roots`` that are no leaf's (at most
    :data:`_MAX_NODES`); None as soon as one of them is in ``stop``."""
    todo = [t.grad_fn for t in tensors_of(roots)]
    seen: set[Any] = set()
    while todo and len(seen) < _MAX_NODES:
        fn = todo.pop()
        if fn is None or fn in seen or getattr(fn, "variable", None) is not None:
            continue
        if stop is not None and fn in stop:
            return None
        seen.add(fn)
        todo.extend(f for f, _ in fn.next_functions)
    return seen


def tensors_of(roots: Any) -> list[torch.Tensor]:
    """The tensors among ``roots`` (a tensor, or a list or tuple of them)."""
    if isinstance(roots, torch.Tensor):
        return [roots]
    if isinstance(roots, (list, tuple)):
        return [t for t in roots if isinstance(t, torch.Tensor)]
    return []
