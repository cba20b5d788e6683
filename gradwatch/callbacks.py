"""What the Lightning and Hugging Face callbacks share: their arguments, the watch session
they open when training starts and close when it ends, and the figures they hand over to
the framework's own logging.

Thread: training (the frameworks call their callbacks there).

The probe (and so torch) is imported when a callback is built, not with this module: the
callback modules first check that their framework and torch are installed.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
