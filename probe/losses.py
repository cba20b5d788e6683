"""The loss and learning rate of each step, with no code from the user and no device sync.

Thread: training (the backward wrapper notes each backward's roots, the step hooks take
them); the values are read on the writer thread (:func:`gradwatch.probe.records.loss_of`).

A step's *loss* is the sum of the values of the roots passed to ``backward()`` by the
backwards the step read (its ``backwards``): as the user passed them, so divided by an
accumulation count where the user divides. A root that ``GradScaler.scale`` made is read
before scaling (the wrapper of ``scale`` in :mod:`gradwatch.probe.patches` tags its output
with its input). A root that is not one floating-point number (``out.backward(grad)`` on a
tensor, a graph edge), a tensor subclass (DTensor), or on a device other than the CPU or
CUDA, leaves its step's loss unknown (None) rather than partial.

Reading a CUDA value on the training thread would wait for the device (a sync per
backward), so a CUDA root is copied, asynchronously, into pinned host memory on its stream,
with an event recorded after the copy; the writer thread waits for the event and reads the
host copy. The copy is enqueued before anything the loop does next, so an in-place change
of the loss tensor afterwards does not reach it. A CPU value is read at once: no sync to
avoid, and cheaper than keeping a copy.
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

import torch

from gradwatch.probe.shards import is_dtensor, local

log = logging.getLogger("gradwatch.probe")

_Tensor = torch.Tensor
UNSCALED = "_gradwatch_unscaled"
"""The attribute ``GradScaler.scale``'s wrapper sets on its output: the tensor it scaled."""
_KEEP = 1024
"""Backwards whose values are kept waiting for a step (an accumulation window longer than
this leaves its steps' loss unknown), checked by :meth:`Roots.trim`."""
_RECENT = 64
"""Values already taken, kept for another optimizer stepping on the same backward (checked
by :meth:`Roots.trim`)."""
_MISSING = object()


class DeviceRead(NamedTuple):
    """A value being copied from the device: ``host`` is valid once ``event`` completed."""

    host: Any
    """The pinned host tensor the copy lands in."""
    event: Any
    """The CUDA event recorded after the copy on the root's stream."""


Value = float | DeviceRead
"""A root's value: read already (CPU), or on its way (CUDA)."""


def capture(t: Any) -> Value | None:
    """The value of one root tensor without a device sync, or None if it has none to read
    (not a single floating-point number, or on another device)."""
    src = getattr(t, UNSCALED, None)
    if src is not None:
        t = src
    if type(t) is _Tensor and t.is_cpu:  # the usual loss, first (Roots.note reads it inline)
        # On the CPU ``.item()`` waits for nothing and costs less than keeping a copy for
        # the writer thread; no later in-place change of the loss reaches the value.
        return float(t.item()) if t.numel() == 1 and t.is_floating_point() else None
    if is_dtensor(t):  # a loss of parallel layers: read the local value, never reduce it
        if not all(pl.is_replicate() for pl in t.placements):
            return None  # a partial or sharded loss: no rank holds its value
        t = local(t)
    if t.numel() != 1 or not t.is_floating_point():
        return None
    kind = t.device.type
    if kind == "cpu":
        return float(t.item())
    if kind == "cuda":
        # No sync on the training thread: the copy is queued on the loss's stream behind
        # the kernels that compute it, and the writer thread waits on the event before it
        # reads the host tensor (records.loss_of). Queued now, before anything the loop
        # does next, so a later in-place change of the loss does not reach the copy.
        host = t.detach().reshape(()).to("cpu", non_blocking=True)  # pinned: torch pins it
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(t.device))
        return DeviceRead(host, event)
    return None


def capture_roots(tensors: Any) -> list[Value] | None:
    """The values of what was passed to ``torch.autograd.backward`` as ``tensors`` (a tensor
    or a sequence of them); None when one of them has no value to read."""
    if type(tensors) is torch.Tensor:
        v = capture(tensors)
        return None if v is None else [v]
    if not isinstance(tensors, (list, tuple)) or not tensors:
        return None
    out: list[Value] = []
    for t in tensors:
        # a plain tensor only: reading a subclass (DTensor, a fake or functional tensor) may
        # run code of its own, a collective even
        if type(t) is not torch.Tensor:
            return None
        v = capture(t)
        if v is None:
            return None
        out.append(v)
    return out


class Roots:
    """The root values of recent backwards, by backward number, until a step takes them."""

    __slots__ = ("on", "scaled", "waiting", "recent")

    def __init__(self) -> None:
        self.on = True
        """False after an unexpected error: losses are then unknown, the rest goes on."""
        self.scaled = False
        """A ``GradScaler`` scaled a loss while this session was open: a root may carry
        :data:`UNSCALED` (looked for only then: a tensor's missing attribute costs a
        raised and caught error at every backward)."""
        self.waiting: dict[int, list[Value] | None] = {}
        """Backward -> its root values, until a step takes them (the tracker writes the
        usual CPU loss here itself; :meth:`trim` bounds it)."""
        self.recent: dict[int, list[Value] | None] = {}
        """Backward -> its values, taken already: for another optimizer stepping on the same
        backward (the tracker's usual step writes here itself; :meth:`trim` bounds it)."""

    def note(self, bw: int, tensors: Any) -> None:
        """Backward ``bw`` starts from ``tensors``; never raises. (Its usual case, a CPU
        loss, is read first in :meth:`Tracker.begin` with fewer torch calls, leaning on
        :attr:`scaled` and on ``item()``'s own checks; whatever that read refuses comes here,
        so this keeps every check: a change of rule goes there too.)"""
        if not self.on:
            return
        try:
            t = tensors
            if (type(t) is _Tensor and t.is_cpu and t.numel() == 1 and t.is_floating_point()
                    and getattr(t, UNSCALED, None) is None):
                # the usual loss, read here (as :func:`capture` reads it): no frame more
                self.waiting[bw] = [t.item()]  # a floating-point tensor's item() is a float
            else:
                self.waiting[bw] = capture_roots(tensors)
        except Exception:  # noqa: BLE001 - never raise into the training loop
            self._fail()

    def trim(self) -> None:
        """Forget the oldest values beyond :data:`_KEEP` waiting (backwards no step took:
        an accumulation window that long leaves its step's loss unknown) and beyond
        :data:`_RECENT` taken. The tracker calls it once in many backwards (each adds at
        most one of each): the usual backward and step pay no check."""
        for kept, most in ((self.waiting, _KEEP), (self.recent, _RECENT)):
            while len(kept) > most:
                del kept[next(iter(kept))]

    def take(self, bws: Any) -> list[Value] | None:
        """The values of the roots of backwards ``bws`` (one step's), or None when one of
        them is unknown or there is none; never raises. (Its usual case, one backward whose
        value waits, is inlined in :meth:`Tracker._emit_step`: a change here goes there
        too.)"""
        if not self.on or not bws:
            return None
        try:
            waiting, recent = self.waiting, self.recent
            out: list[Value] = []
            for b in bws:
                v = waiting.pop(b, _MISSING)
                if v is _MISSING:
                    v = recent.get(b, _MISSING)
                else:
                    recent[b] = v  # type: ignore[assignment]
                if v is _MISSING or v is None:
                    return None
                out.extend(v)  # type: ignore[arg-type]
            return out
        except Exception:  # noqa: BLE001
            self._fail()
            return None

    def _fail(self) -> None:
        self.on = False
        self.waiting.clear()
        self.recent.clear()
        log.warning("gradwatch: cannot read the loss passed to backward(); steps record "
                    "no loss from now on", exc_info=True)


class LoggedScalars(NamedTuple):
    """Values the user logged (``WatchHandle.log``), handed to the writer thread, which reads
    them (a CUDA tensor's once its copy landed) into a :class:`~gradwatch.wire.Scalars`."""

    t: float
    step: int
    opt: str | None
    values: dict[str, Value]


def scalar_value(name: str, x: Any) -> Value:
    """One value given to ``WatchHandle.log``: a number, or a tensor of one number (a CUDA
    one read later, without a sync).

    Raises:
        TypeError: not a real number (a string, a bool, a tensor of several numbers).
    """
    if isinstance(x, bool) or not isinstance(x, (int, float, torch.Tensor)) and not (
            hasattr(x, "__float__") and hasattr(x, "dtype")):  # numpy scalars
        raise TypeError(f"handle.log({name}=...) takes a number (int, float, or a tensor of "
                        f"one number); got {type(x).__name__}.")
    if isinstance(x, torch.Tensor):
        if x.numel() != 1 or x.is_complex() or x.dtype == torch.bool:
            raise TypeError(f"handle.log({name}=...) takes a tensor of one real number; got "
                            f"a {x.dtype} tensor of shape {tuple(x.shape)}.")
        v = capture(x if x.is_floating_point() else x.double())
        if v is None:  # on a device whose values we do not copy asynchronously
            v = float(x.detach().cpu().item())
        return v
    try:
        return float(x)
    except (TypeError, ValueError, OverflowError) as e:
        raise TypeError(f"handle.log({name}=...) takes a real number; got {x!r}.") from e


def learning_rates(opt: Any) -> list[float] | None:
    """Each param group's ``lr`` as a float, or None when one is missing or is a tensor
    that is not on the CPU (reading it would sync with the device); never raises."""
    try:
        groups = opt.param_groups
        if len(groups) == 1 and type(lr := groups[0].get("lr")) is float:
            return [lr]  # the usual optimizer, first (inlined in Tracker._emit_step too)
        out = []
        for g in groups:
            lr = g.get("lr")
            if isinstance(lr, (float, int)) and not isinstance(lr, bool):
                out.append(float(lr))
            elif (isinstance(lr, torch.Tensor) and lr.device.type == "cpu"
                  and lr.numel() == 1):
                out.append(float(lr.item()))
            else:
                return None
        return out or None
    except Exception:  # noqa: BLE001 - a strange optimizer: no learning rate, no error
        return None
