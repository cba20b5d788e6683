"""The virtual optimizer ``manual``: parameters updated by hand, judged by a ledger of their own.

Thread: training (:mod:`gradwatch.probe.unowned` calls it at backward boundaries).

A loop with no optimizer (``p.data.add_(p.grad, alpha=-lr)``, ``with torch.no_grad(): p -= lr *
p.grad``) steps when it updates its parameters in place. :mod:`~gradwatch.probe.unowned` sees
such an update at the next *boundary* (a backward starting, or a ``Module.zero_grad``) and
calls :meth:`Manual.step` there; the step is then counted and judged by an ordinary
:class:`~gradwatch.probe.ledger.Ledger` (the same four kinds), attached through the tracker
to a stand-in optimizer (:class:`ManualUpdates`) whose ``param_groups`` hold those parameters.
What it needs of the tracker it is handed when made (:class:`Doors`): how to attach and grow
the stand-in, and where a step's facts go.

The update read the gradients as the last backward left them, but a reset may have run since
(``p.grad = None`` or ``model.zero_grad()`` right after the update). So the step runs with
those gradients put back in ``.grad`` for its duration (what a reset replaced is restored at
once), and the ledger sees the reset after the step, where it happened. A gradient zeroed in
place since (``p.grad.zero_()``) cannot be put back: once a step's norms read zero where the
step counted fresh contributions, its norms are taken when each backward ends instead
(:meth:`Manual.after_backward`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import torch

from gradwatch.probe.facts import NormSample, StepFacts, TextbookStep
from gradwatch.probe.names import from_frames
from gradwatch.probe.norms import sample

if TYPE_CHECKING:
    from gradwatch.probe.ledger import Ledger

NAME = "manual"
"""The virtual optimizer's name (a ``'`` is added if the script named an optimizer so)."""


class ManualUpdates:
    """Stands in for an optimizer (:meth:`Tracker.attach` reads ``param_groups``): the
    parameters updated by hand."""

    def __init__(self) -> None:
        self.param_groups: list[dict[str, Any]] = [{"params": []}]

    @staticmethod
    def named(params: Sequence[torch.Tensor], names: list[str]) -> list[str]:
        """``names`` where the session's namer found one, else the variable of the script
        that holds the tensor (a plain tensor such as ``W``: no module names it)."""
        return named_by_frames(params, names, "group0.")


class Doors(NamedTuple):
    """What the virtual optimizer is given of the tracker that made it."""

    attach: Callable[[torch.optim.Optimizer, str], Ledger]
    """Start tracking an optimizer under a name (no step hooks of its own): its ledger."""
    grew: Callable[[torch.optim.Optimizer], None]
    """A tracked optimizer's ``param_groups`` grew: track the new parameters."""
    emit_step: Callable[[StepFacts], None]
    """Hand a step's facts over (the loss and lr are added as for any step)."""
    norms_every: int
    """The session's norm sampling (every N steps, 0 never)."""


class Manual:
    """The virtual optimizer of one session: created at its first step. Owned by
    :class:`~gradwatch.probe.unowned.Unowned`."""

    __slots__ = ("doors", "opt", "led", "every", "at_end", "pre_norms")

    def __init__(self, doors: Doors) -> None:
        self.doors = doors
        self.opt = ManualUpdates()
        self.led: Ledger | None = None
        self.every = doors.norms_every
        self.at_end = False
        """Norms are taken when each backward ends (gradients were seen zeroed in place
        between an update and the next boundary)."""
        self.pre_norms: NormSample | None = None

    @property
    def params(self) -> list[torch.Tensor]:
        """The parameters updated by hand so far (the ledger's list: do not change it)."""
        return self.led.params if self.led is not None else []

    def step(self, new: list[torch.Tensor], end_grads: dict[int, torch.Tensor]) -> None:
        """An update by hand happened since the last boundary: count and judge it as a step
        that read ``end_grads`` (``id(param)`` -> its gradient when the last backward ended),
        ``new`` joining the parameters first."""
        restore: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        try:
            for p in [*self.params, *new]:
                g = end_grads.get(id(p))
                if g is not None and p.grad is not g:
                    restore.append((p, p.grad))
                    p.grad = g  # what the update read, for the length of the step
            if new:
                self._join(new)
            led = self.led
            if led is None:
                return
            facts = led.plain_step()
        finally:
            for p, g in restore:
                p.grad = g
        self._settle_norms(facts)
        self.doors.emit_step(facts)

    def after_backward(self) -> None:
        """A backward ended: take the norms its gradients have, when the next step needs
        them from here (:attr:`at_end`)."""
        led = self.led
        if not self.at_end or led is None or not self.every or led.step % self.every:
            return
        self.pre_norms = sample(led.reader.grads(led.params), None, [], [], None)

    def _join(self, new: list[torch.Tensor]) -> None:
        self.opt.param_groups[0]["params"].extend(new)
        # attach and its ledger read only ``param_groups`` (and ``grad_scale`` if there)
        stand_in = cast(torch.optim.Optimizer, self.opt)
        if self.led is None:
            self.led = self.doors.attach(stand_in, NAME)
        else:
            self.doors.grew(stand_in)

    def _settle_norms(self, facts: StepFacts) -> None:
        """The step's norms: taken at the last backward's end (:attr:`at_end`), or as the
        ledger read them unless they read zero where fresh contributions were counted."""
        textbook = isinstance(facts, TextbookStep)
        got = facts.norms if isinstance(facts, TextbookStep) else facts.tally.norms
        if self.at_end:
            got, self.pre_norms = self.pre_norms, None
            if got is not None and not textbook:
                stale = facts.tally.stale_params  # type: ignore[union-attr]
                got.unknown = [j for j, k in enumerate(got.ks) if k in stale]
        elif got is not None and _zero(got) and (
                textbook or facts.tally.fresh):  # type: ignore[union-attr]
            got = None  # zeroed in place after the update: from now on, read at the end
            self.at_end = True
            if self.led is not None:
                self.led.norms.every = 0
        if isinstance(facts, TextbookStep):
            facts.norms = got
        else:
            facts.tally.norms = got


def _zero(norms: Any) -> bool:
    """Whether norms read on the host are all zero (device values are not read: no sync)."""
    vals = norms if isinstance(norms, list) else norms.norms
    return isinstance(vals, list) and bool(vals) and not any(vals)


def named_by_frames(params: Sequence[torch.Tensor], names: list[str],
                    prefix: str = "") -> list[str]:
    """``names``, where one is only a position (``{prefix}param{k}``) replaced by what the
    script's frames call the tensor (:func:`gradwatch.probe.names.from_frames`), if they do."""
    if not any(n == f"{prefix}param{k}" for k, n in enumerate(names)):
        return names
    found = from_frames(params)
    return [found[k] if n == f"{prefix}param{k}" and found[k] != f"param{k}" else n
            for k, n in enumerate(names)]
