"""The watch sessions opened for the user by the integrations: one home.

* :class:`CallbackSession`: a Lightning or Hugging Face callback's, over the optimizers the
  framework sets up, opened when training starts and closed (its verdict said in one line)
  when it ends; with the figures it hands over to the framework's own logging.
* :class:`AutoWatch`: over every optimizer a program makes or steps while it is open, as
  ``gradwatch run`` does for a script (:class:`gradwatch.probe.autostart.AutoSession`, which
  opens at the script's first optimizer), read in slices: the pytest plugin judges one test
  with it, the notebook extension one cell at a time.

Thread: training (the frameworks call their callbacks there; the test's or the notebook's
thread, between its training steps).

The probe (and so torch) is imported when a session is built, not with this module: the
callback modules first check that their framework and torch are installed.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gradwatch.wire import Finding

if TYPE_CHECKING:
    import torch

    from gradwatch.probe.api import WatchHandle

log = logging.getLogger("gradwatch")

PREFIX = "gradwatch/"
"""Prefix of every metric name the callbacks hand over (``gradwatch/drift``)."""


def say(line: str) -> None:
    """Print the run's verdict on a line of its own, as ``gradwatch run`` does: it is for
    the person at the terminal, whatever logging is set to. A progress bar still drawn
    (tqdm: the Trainer closes its own after the callbacks' ``on_train_end``) is cleared
    first and redrawn after, so the line is never glued to it."""
    tqdm = sys.modules.get("tqdm")
    bars = getattr(getattr(tqdm, "tqdm", None), "_instances", None)
    if tqdm is not None and bars:
        tqdm.tqdm.write(line, file=sys.stderr)
    else:
        print(line, file=sys.stderr, flush=True)


class CallbackSession:
    """One framework callback's watch: its arguments, checked when the callback is built, and
    one watch session per training run (:meth:`open` ... :meth:`close`).

    Holds no session until :meth:`open`, so a callback pickles (Lightning's ``ddp_spawn``
    sends the trainer, callbacks included, to its worker processes).
    """

    def __init__(self, log: str | os.PathLike[str] | None, server: str | None,
                 run_name: str | None, norms_every: int, log_metrics: bool) -> None:
        """Raises ``TypeError``/``ValueError`` with a sentence to act on, as ``watch()``."""
        from gradwatch.probe.watchargs import validate_options

        validate_options(log, server, run_name, norms_every)
        if not isinstance(log_metrics, bool):
            raise TypeError(f"log_metrics= must be True or False; got {log_metrics!r}.")
        self.step_log = log
        self.server = server
        self.run_name = run_name
        self.norms_every = norms_every
        self.log_metrics = log_metrics
        self.handle: WatchHandle | None = None
        self._handed: dict[str, int] = {}
        """Per optimizer, the step whose figures were last handed over."""

    def open(self, optimizers: Sequence[Any], labels: Sequence[str | None], *,
             model: torch.nn.Module | None, default_log: Path, run_name: str,
             run_id: str | None,
             labeler: Callable[[torch.optim.Optimizer], str | None] | None = None
             ) -> WatchHandle:
        """Start watching ``optimizers`` (wrappers are unwrapped), closing a session an
        earlier run left open. ``labels``: a display name per optimizer, None where the
        framework's code gives it none; ``labeler`` names those (when attached and at their
        first step, as ``watch()`` does); ``default_log``: the step log when ``log=`` was
        not given.
        """
        from gradwatch.probe.api import WatchHandle
        from gradwatch.probe.names import held_label
        from gradwatch.probe.watchargs import validate

        if self.handle is not None:  # the framework never told us the last run ended
            self.close("failed")
        names = {opt: label for opt, label in zip(optimizers, labels, strict=True) if label}
        log_ = self.step_log if self.step_log is not None else default_log
        opts, given = validate(list(optimizers), model, log_, self.server, self.run_name,
                               self.norms_every, names or None)
        self.handle = WatchHandle(
            opts, given, model=model, log=log_, server=self.server,
            run_name=self.run_name or run_name, norms_every=self.norms_every, run_id=run_id,
            labeler=labeler or held_label)
        self._handed.clear()
        return self.handle

    def close(self, status: str = "finished") -> None:
        """End the session (idempotent) and log its verdict in one line."""
        handle, self.handle = self.handle, None
        if handle is None:
            return
        handle.close(status=status)
        findings = handle.findings()
        where = f" (step log: {handle.path})" if handle.path else ""
        steps = handle.tracker.steps
        counted = f"{steps} optimizer step{'s' if steps != 1 else ''}"
        stopped = handle.stopped()
        if stopped:  # judged in part: never "no bug found"
            say(f"gradwatch: {counted} judged, {len(findings)} finding"
                f"{'s' * (len(findings) != 1)}; {stopped}{where}")
        elif findings:
            kinds = ", ".join(sorted({f"{f.kind} on {f.optimizer}" for f in findings}))
            say(f"gradwatch: {counted}, {len(findings)} finding"
                f"{'s' * (len(findings) != 1)}: {kinds}{where}")
        elif steps:
            say(f"gradwatch: {counted}, no gradient-reset bug found{where}")
        else:
            say(f"gradwatch: no optimizer stepped, so nothing was judged{where}")

    def forward(self, values: Mapping[str, Any]) -> None:
        """Put what the user logged to the framework on the run's step axis
        (:meth:`WatchHandle.log <gradwatch.probe.api.WatchHandle.log>`, at the latest step):
        numbers and one-number tensors (read without a device sync); anything else, and this
        callback's own ``gradwatch/`` figures, is left out. Never raises."""
        handle = self.handle
        if handle is None or not values:
            return
        try:
            picked = {str(k)[:200]: v for k, v in values.items()
                      if not str(k).startswith(PREFIX) and _is_number(v)}
            if picked:
                handle.log(**dict(list(picked.items())[:256]))
        except Exception:  # noqa: BLE001 - a metric we cannot read must not stop training
            log.debug("gradwatch: could not forward logged metrics", exc_info=True)

    def metrics(self) -> dict[str, float]:
        """The figures of each optimizer's latest written step not handed over yet:
        ``gradwatch/drift``, ``gradwatch/norm``, ``gradwatch/fresh_norm`` (one optimizer)
        or ``gradwatch/<optimizer>/drift``, ... (several, by the name findings use), and
        ``gradwatch/findings``.

        Empty when nothing new was written. Figures a step did not sample (``norms_every``)
        are left out. Reads what the writer thread published: no wait, no tensor.
        """
        handle = self.handle
        if handle is None:
            return {}
        several = len(handle.tracker.ledgers) > 1
        # the optimizer as its findings name it (``d_opt``), not its id (``Adam#1``)
        labels = {led.name: label for led, label in handle.tracker.labels.items()}
        out: dict[str, float] = {}
        findings = -1
        for name, fig in handle.latest().items():
            if self._handed.get(name) == fig.step:
                continue
            self._handed[name] = fig.step
            findings = max(findings, fig.findings)
            prefix = f"{PREFIX}{labels.get(name, name)}/" if several else PREFIX
            for key, value in (("drift", fig.drift), ("norm", fig.norm),
                               ("fresh_norm", fig.fresh_norm)):
                if value is not None:
                    out[prefix + key] = value
        if findings >= 0:
            out[f"{PREFIX}findings"] = float(findings)
        return out


def _is_number(v: Any) -> bool:
    """A real number, or a tensor of one (torch imported only if the value is a tensor)."""
    if isinstance(v, bool):
        return False
    if isinstance(v, (int, float)):
        return True
    if type(v).__module__.startswith("torch"):
        import torch

        return (isinstance(v, torch.Tensor) and v.numel() == 1 and not v.is_complex()
                and v.dtype != torch.bool)
    return False


class HasSession:
    """What both callbacks show of their session: the ``log=`` asked for and the open handle."""

    _session: CallbackSession

    @property
    def step_log(self) -> str | os.PathLike[str] | None:
        """The ``log=`` argument: the step log path asked for (None: the default). Not
        ``log``: Lightning uses a callback's ``log`` for itself."""
        return self._session.step_log

    @property
    def handle(self) -> WatchHandle | None:
        """The open watch session, or None."""
        return self._session.handle


Broadcast = Callable[[Any], Any]
"""Sends rank 0's value of a picklable object to every rank and returns it."""


def run_identity(run_name: str, broadcast: Broadcast | None) -> tuple[str, str]:
    """``(run id, run name)`` as rank 0 has them, so every rank of a job writes one run.

    The id is ``GRADWATCH_RUN_ID``, else ``TORCHELASTIC_RUN_ID``, else random; ``broadcast``
    is None in a single process.
    """
    from gradwatch.probe import runinfo

    mine = (runinfo.run_id(None), run_name)
    if broadcast is None:
        return mine
    run, name = broadcast(mine)
    return str(run), str(name)


def torch_distributed_broadcast() -> Broadcast | None:
    """A broadcast from rank 0 over ``torch.distributed`` when a process group of more than
    one rank is up; None otherwise."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None

    def broadcast(value: Any) -> Any:
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    return broadcast


@dataclass(frozen=True)
class Slice:
    """What happened since the previous :meth:`AutoWatch.since_last`."""

    steps: int
    """Optimizer steps judged in the slice."""
    findings: list[tuple[Finding, bool]]
    """Findings that gained steps in the slice, each with whether it is new in the run."""


class AutoWatch:
    """Opens a session in ``auto`` mode: every ``torch.optim.Optimizer`` built while it is
    open is attached at once, and one built earlier at its first step. Parameter names come
    from the modules found in memory.

    Args:
        log: step log path; server, run_name, norms_every, run_id: as ``gradwatch.watch()``.

    Raises:
        gradwatch.extras.TorchMissingError: torch is not installed.
        TypeError, ValueError: an argument is wrong.
    """

    def __init__(self, log: str | os.PathLike[str], *, server: str | None = None,
                 run_name: str | None = None, norms_every: int = 1,
                 run_id: str | None = None) -> None:
        from gradwatch.probe import names
        from gradwatch.probe.api import WatchHandle
        from gradwatch.probe.watchargs import validate_options

        validate_options(log, server, run_name, norms_every)
        self.handle: WatchHandle = WatchHandle(
            [], log=log, server=server, run_name=run_name, norms_every=norms_every,
            run_id=run_id, auto=True, namer=names.from_live_modules,
            labeler=names.optimizer_label)
        self._steps = 0
        self._reported: dict[tuple[int, str, str], int] = {}
        """Steps of each finding (by rank, optimizer, kind) at the last slice."""

    @property
    def steps(self) -> int:
        """Optimizer steps judged so far."""
        return int(self.handle.tracker.steps)

    def stepped(self) -> bool:
        """Whether an optimizer stepped since the previous :meth:`since_last` (no wait)."""
        return self.steps != self._steps

    def since_last(self) -> Slice:
        """Steps and findings since the previous call (or the start).

        Waits for the writer thread to judge what was handed to it (at most its poll
        interval): call it between cells or at the end of a test, never inside training.
        """
        steps = self.steps
        self.handle.writer.settle()
        grown = []
        for f in self.handle.findings():
            key = (f.rank, f.optimizer, f.kind)
            before = self._reported.get(key)
            if before is None or f.steps > before:
                grown.append((f, before is None))
            self._reported[key] = f.steps
        out = Slice(steps - self._steps, grown)
        self._steps = steps
        return out

    def close(self, status: str = "finished") -> None:
        """Close the session: hooks removed, wrappers restored, step log ended."""
        self.handle.close(status=status)
