"""``gradwatch.watch()`` and its handle: validate, wire tracker -> writer -> streamer, undo.

``watch()`` checks its arguments at once (``TypeError``/``ValueError`` with a sentence to act
on). The handle is a context manager; ``close()`` removes every hook, restores every
wrapper, writes ``Stats`` and ``End`` and flushes the step log. An ``atexit`` hook closes a
handle the program forgot.

Thread: training (the user's thread calls ``watch()`` and ``close()``; ``atexit`` may close).
"""

from __future__ import annotations

import atexit
import logging
import os
import shlex
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import CodeType
from typing import TYPE_CHECKING, Any

import torch

from gradwatch.probe import names, patches, runinfo
from gradwatch.probe.losses import LoggedScalars, scalar_value
from gradwatch.probe.names import held_label
from gradwatch.probe.tracker import Tracker
from gradwatch.probe.watchargs import validate
from gradwatch.probe.writer import RecordWriter, StepFigures
from gradwatch.steplog import is_compressed
from gradwatch.wire import STEP_MAX, End, Finding, Stats

if TYPE_CHECKING:
    from gradwatch.stream import Streamer

log = logging.getLogger("gradwatch.probe")

class WatchHandle:
    """A watch session. Use as a context manager or call :meth:`close`."""

    def __init__(self, optimizers: Sequence[torch.optim.Optimizer],
                 labels: Sequence[str | None] = (), *, model: torch.nn.Module | None = None,
                 log: str | os.PathLike[str] | None = None, server: str | None = None,
                 run_name: str | None = None, norms_every: int = 1,
                 run_id: str | None = None, auto: bool = False,
                 namer: names.Namer | None = None,
                 labeler: Callable[[torch.optim.Optimizer], str | None] | None = None,
                 worker: int | None = None, exact_log: bool = False,
                 report_unsent: bool = True) -> None:
        """``watch()``'s arguments, and for ``gradwatch run``: ``auto`` (attach to every
        optimizer), ``namer`` and ``labeler`` (parameter names and optimizer labels found
        in the script), ``worker`` (this is a worker process the script started: its
        number, for the header), ``exact_log`` (``log`` is already this process's path:
        no ``.rank<R>`` is added) and ``report_unsent`` (log, at close, the records the
        server never acknowledged; ``gradwatch run`` prints them in its verdict instead)."""
        self.run_id = runinfo.run_id(run_id)
        self._report_unsent = report_unsent
        self.rank, self.world_size = runinfo.rank_world()
        self.server = server
        path: Path | None = None
        if log is not None:
            path = (Path(log) if exact_log
                    else runinfo.log_path(log, self.rank, self.world_size))
        elif server is not None:
            path = runinfo.spool_path(self.run_id, self.rank)
        self.path = path
        header = runinfo.header(self.run_id, run_name, self.rank, self.world_size,
                                norms_every, worker)
        self.writer = RecordWriter(header, path)
        self.streamer: Streamer | None = None
        if server is not None and path is not None:
            self.streamer = _start_streamer(server, path, self.run_id, self.rank)
            self.writer.streamer = self.streamer
        if namer is None and model is not None:
            namer = names.from_model(model)
        self.tracker = Tracker(self.writer.put, norms_every=norms_every, namer=namer,
                               auto=auto, on_disable=self._on_disable, labeler=labeler)
        self._closed = False
        patches.register(self.tracker, auto=auto)
        try:
            padded = list(labels) + [None] * (len(optimizers) - len(labels))
            for opt, label in zip(optimizers, padded, strict=True):
                self.tracker.attach(opt, label)
        except Exception:
            self.close()
            raise
        atexit.register(self._atexit)

    def stand_in(self, code: CodeType) -> None:
        """Name the user's function ``code`` (a LightningModule's ``training_step``, a Trainer
        subclass's ``compute_loss``) for the backward, step and reset calls a framework makes
        on the user's behalf, instead of the framework's lines (the framework callbacks)."""
        for role in ("backward", "step", "reset"):
            self.tracker.sites.stand_in(role, code)

    def reset_hook(self, code: CodeType) -> None:
        """The user's override of the framework's reset hook (a LightningModule's
        ``optimizer_zero_grad``): it names the resets the framework makes, and a missed
        reset names it as the line to change, even when it never resets (the framework
        callbacks)."""
        self.tracker.sites.reset_hook = code
        self.tracker.sites.stand_in("reset", code)
    def _on_disable(self, reason: str) -> None:
        self.writer.put(self._stats(self.writer.dropped))

    def _stats(self, dropped: int) -> Stats:
        """The probe's health; once it turned itself off, why and where it stopped judging
        (every verdict reads it: a run judged only in part is never "clean")."""
        disabled = self.tracker.disabled
        last = self.tracker.last_step if disabled else None
        return Stats(seq=0, t=time.time(), dropped=dropped, disabled=disabled,
                     last_step=last[1] if last else None, last_opt=last[0] if last else None)

    def findings(self) -> list[Finding]:
        """Findings of the records the writer thread has written so far.

        Reads the writer thread's verdict: exact after :meth:`close`, or after
        ``self.writer.settle()``; in between it may trail the loop by the writer's round.
        """
        return self.writer.verdict.findings()

    def latest(self) -> Mapping[str, StepFigures]:
        """Each optimizer's latest step the writer thread has written, by optimizer name:
        its norms, drift and the run's finding count, as host floats.

        One attribute read: never waits on the writer thread and never touches a tensor, so
        it is safe to call every training step. The figures trail the training loop by the
        writer's round (at most ``poll`` seconds).
        """
        return self.writer.latest

    def log(self, step: int | None = None, **scalars: Any) -> None:
        """Put values on the run's step axis, beside the loss and the norms: a validation
        loss, an accuracy (``handle.log(val_loss=0.4, acc=0.91)``).

        Never waits: a CUDA tensor is copied without a device sync and read on the writer
        thread. NaN and infinities are data. Does nothing once the session is closed.

        Args:
            step: the step they belong to, an index of the run's first optimizer's steps;
                None (the default): the latest step of the run, of the optimizer that took
                it (0 before any step).
            **scalars: name=value, each a real number (int, float, numpy scalar) or a tensor
                of one real number; at most 256 names of at most 200 characters.

        Raises:
            TypeError: a value is not a real number, ``step`` is not an int, or no value
                was given.
            ValueError: ``step`` is negative or too large, or too many or too long names.
        """
        if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
            raise TypeError(f"handle.log(step=...) takes an int or None; got "
                            f"{type(step).__name__}.")
        if step is not None and not 0 <= step <= STEP_MAX:
            raise ValueError(f"handle.log(step=...) must be between 0 and {STEP_MAX}; got "
                             f"{step}.")
        if not scalars:
            raise TypeError("handle.log() needs at least one value, e.g. "
                            "handle.log(val_loss=0.42).")
        if len(scalars) > 256 or any(len(k) > 200 or not k for k in scalars):
            raise ValueError("handle.log() takes at most 256 values, named with 1 to 200 "
                             "characters each.")
        values = {k: scalar_value(k, v) for k, v in scalars.items()}
        if self._closed:
            return
        opt: str | None = None
        if step is None:
            opt, step = self.tracker.last_step or (None, 0)
        self.writer.put(LoggedScalars(time.time(), step, opt, values))

    @property
    def disabled(self) -> str | None:
        """Why the probe turned itself off, or None while it runs."""
        return self.tracker.disabled

    def stopped(self) -> str | None:
        """Where judging stopped, once the probe turned itself off ("nothing judged after
        step N of opt: the probe turned itself off (cause)"), else None. Exact after
        :meth:`close`: it is what the step log says."""
        if self.tracker.disabled is None:
            return None
        return self.writer.verdict.stopped_text() or (
            f"the probe turned itself off ({self.tracker.disabled})")

    @property
    def unsent(self) -> int:
        """Records the server has not acknowledged (0 without a server): after
        :meth:`close`, those that never arrived. They are in the step log (:attr:`path`)."""
        if self.streamer is None:
            return 0
        acked = self.streamer.stats().acked_seq
        return max(0, self.writer.written - 1 - acked)

    def unsent_report(self) -> str | None:
        """A sentence on the records the server never acknowledged: how many, where they
        are and the command that sends them; None when every record arrived."""
        n = self.unsent
        if not n or self.streamer is None:
            return None
        why = self.streamer.stats().disabled
        return (f"gradwatch: the server at {self.server} did not acknowledge {n} record"
                f"{'s' if n != 1 else ''} of run {self.run_id}"
                f"{f' ({why})' if why else ''}; they are in {self.path}. Send them with: "
                f"{resend_command(self.path, self.server)}")

    def close(self, status: str = "finished", exit_code: int | None = None) -> None:
        """Remove every hook and wrapper, write ``Stats`` and ``End``, flush. Idempotent."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._atexit)
        self.tracker.close()
        patches.unregister(self.tracker)
        dropped = self.writer.dropped + _streamer_dropped(self.streamer)
        self.writer.put_blocking(self._stats(dropped))
        self.writer.put_blocking(End(seq=0, t=time.time(), status=status,  # type: ignore[arg-type]
                                     exit_code=exit_code, steps=self.tracker.steps,
                                     dropped=dropped))
        self.writer.close()
        if self.streamer is not None:
            try:
                self.streamer.close(timeout=5.0)
            except Exception:  # noqa: BLE001
                log.warning("gradwatch: closing the streamer failed", exc_info=True)
            try:
                report = self.unsent_report()
            except Exception:  # noqa: BLE001 - the report must not break close()
                report = None
                log.warning("gradwatch: could not tell what the server lacks", exc_info=True)
            if report and self._report_unsent:
                log.warning("%s", report)

    def _atexit(self) -> None:
        self.close(status="failed" if getattr(sys, "last_value", None) is not None
                   else "finished")

    def __enter__(self) -> WatchHandle:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        elif issubclass(exc_type, KeyboardInterrupt):
            self.close(status="interrupted")
        else:
            self.close(status="failed")


def _start_streamer(server: str, path: Path, run: str, rank: int) -> Streamer | None:
    if is_compressed(path):  # watch() refuses it; a session gradwatch run starts says so
        log.warning("gradwatch: cannot stream %s to %s: a streamed log must be plain (drop "
                    "'.gz'); writing the step log only", path, server)
        return None
    try:
        from gradwatch.stream import Streamer
        from gradwatch.streamkey import UnsafeKeyFile, key_file, new_key, own_key

        try:
            key = own_key(path)
        except UnsafeKeyFile as e:  # a key another user could know: the stream is not ours
            log.warning("gradwatch: not streaming to %s: the stream key file %s (another "
                        "user could know the key); remove it or make it yours (same owner, "
                        "chmod 600); writing the step log %s only", server, e, path)
            return None
        except OSError as e:  # the stream stays ours; only a later resume cannot prove it
            key = new_key()
            log.warning("gradwatch: cannot keep the stream key in %s (%s); `gradwatch replay "
                        "--resume` will not be able to complete this run", key_file(path), e)
        # trusted: the writer thread writes the spool from records the probe made
        s = Streamer(server, path, run, rank, token=os.environ.get("GRADWATCH_TOKEN"),
                     key=key, trusted=True)
        s.start()
        return s
    except Exception as e:  # noqa: BLE001 - streaming is optional; the log goes on
        log.warning("gradwatch: cannot stream to %s (%s: %s); writing the step log %s only",
                    server, type(e).__name__, e, path)
        return None


def resend_command(path: Path | None, server: str | None) -> str:
    """The shell command that sends a step log's missing records into its own run."""
    return (f"gradwatch replay {shlex.quote(str(path))} --resume --server "
            f"{shlex.quote(server or 'ws://127.0.0.1:8765')}")


def _streamer_dropped(streamer: Streamer | None) -> int:
    """Records the streamer lost for good (0 without one, or if it cannot say)."""
    if streamer is None:
        return 0
    try:
        return streamer.stats().dropped
    except Exception:  # noqa: BLE001
        return 0


def watch(optimizer_or_list: Any = None, *, model: torch.nn.Module | None = None,
          log: str | os.PathLike[str] | None = None, server: str | None = None,
          run_name: str | None = None, norms_every: int = 1,
          names: Sequence[str] | Mapping[Any, str] | None = None,
          run_id: str | None = None) -> WatchHandle:
    """Watch optimizers for gradient-reset bugs.

    Every session also watches what no watched optimizer holds: parameters that receive
    gradients and are never updated (``untrained_params``), and parameters updated in place
    by hand, judged as the steps of a virtual optimizer named ``manual``.

    Args:
        optimizer_or_list: an optimizer, a wrapper of one (Accelerate, Lightning), or a list;
            None (the default) for a loop with no optimizer, that updates its parameters by
            hand.
        model: the module owning the parameters, for parameter names.
        log: path of the JSON Lines step log (``<stem>.rank<R><suffix>`` per rank when the
            world size is above 1).
        server: gradwatch server URL to stream to (the log, or a spool file, is the buffer).
        run_name: display name of the run.
        norms_every: sample gradient norms every N steps (0 = never); judging is every step.
        names: display names of the optimizers (a list, or a dict optimizer -> name).
        run_id: run id shared by the ranks (default ``GRADWATCH_RUN_ID``, then
            ``TORCHELASTIC_RUN_ID``, then random).

    Returns:
        A handle: a context manager with ``close()`` and ``findings()``.

    Raises:
        TypeError, ValueError: an argument is wrong; the message says how to fix it.
    """
    opts, labels = validate(optimizer_or_list, model, log, server, run_name, norms_every,
                             names)
    if run_id is not None and not isinstance(run_id, str):
        raise TypeError("run_id= must be a string.")
    # an optimizer given no name is named as the calling code holds it (``opt``), here or
    # at its first step
    return WatchHandle(opts, labels, model=model, log=log, server=server, run_name=run_name,
                       norms_every=norms_every, run_id=run_id, labeler=held_label)
