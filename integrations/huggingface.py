"""``gradwatch.huggingface.GradwatchCallback``: watch a Hugging Face ``Trainer``'s optimizer.

::

    from gradwatch.huggingface import GradwatchCallback
    trainer = Trainer(model=model, args=args, train_dataset=ds,
                      callbacks=[GradwatchCallback(log="run.jsonl")])

Without ``transformers``, importing this module raises
:class:`gradwatch.extras.MissingPackageError`, an ``ImportError`` whose one sentence names
the package to install.

Thread: training (the Trainer calls its callbacks there).
"""

from __future__ import annotations

import inspect
import logging
import os
from pathlib import Path
from types import CodeType
from typing import TYPE_CHECKING, Any

from gradwatch.extras import TRANSFORMERS, require

require("gradwatch.huggingface", TRANSFORMERS)

from transformers import (  # noqa: E402
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)
from transformers.trainer_callback import CallbackHandler  # noqa: E402

from gradwatch.integrations.sessions import (  # noqa: E402
    CallbackSession,
    HasSession,
    run_identity,
    torch_distributed_broadcast,
)

if TYPE_CHECKING:
    import torch

__all__ = ["GradwatchCallback"]

log = logging.getLogger("gradwatch")


class GradwatchCallback(HasSession, TrainerCallback):
    """Watches the Trainer's optimizer from ``on_train_begin`` (the optimizer exists then)
    to ``on_train_end``, and judges every optimizer step: gradient accumulation, clipping
    and the Trainer's own ``model.zero_grad()`` after each step are what a clean run does.

    The run is named ``args.run_name``, else after ``args.output_dir``. Under a distributed
    launch every rank writes its own step log (``<stem>.rank<R><suffix>``) of one run: rank
    0's run id and name are broadcast. A run that raises is closed at the program's exit
    (the Trainer calls no callback then), or when ``train()`` runs again.

    What the Trainer logs (``loss``, ``learning_rate``, ``eval_loss``...) goes on the run's
    step axis too, beside the probe's own loss and learning rate (``WatchHandle.log``); for
    anything else, call ``callback.handle.log(name=value)``.

    Args:
        log: step log path (default: ``gradwatch.jsonl`` in ``args.output_dir``).
        server: gradwatch server URL to stream to.
        run_name: display name of the run (default: see above).
        norms_every: sample gradient norms every N steps (0 = never); judging is every step.
        log_metrics: also add the latest written step's figures (``gradwatch/drift``,
            ``gradwatch/norm``, ``gradwatch/fresh_norm``, ``gradwatch/findings``) to the
            ``logs`` of every ``on_log``, so the reporters (TensorBoard, W&B, MLflow...) get
            them. The values are host floats the probe's writer thread has already
            published: no device sync, no wait.

    Raises:
        TypeError, ValueError: an argument is wrong; the message says how to fix it.
    """

    def __init__(self, log: str | os.PathLike[str] | None = None, server: str | None = None,
                 run_name: str | None = None, norms_every: int = 1,
                 log_metrics: bool = False) -> None:
        self._session = CallbackSession(log, server, run_name, norms_every, log_metrics)

    def on_train_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, model: torch.nn.Module | None = None,
                       optimizer: Any = None, **kwargs: Any) -> None:
        if optimizer is None:
            log.warning("gradwatch: the Trainer passed no optimizer to on_train_begin; "
                        "nothing is watched")
            return
        out = Path(args.output_dir or ".")
        run, name = run_identity(args.run_name or out.name or "trainer",
                                 torch_distributed_broadcast())
        # named as the Trainer's code (and a subclass's) holds it
        self._session.open([optimizer], ["self.optimizer"], model=model,
                           default_log=out / "gradwatch.jsonl", run_name=name, run_id=run)
        user_fn = _subclass_step(inspect.currentframe())
        if user_fn is not None and self._session.handle is not None:
            self._session.handle.stand_in(user_fn)
        if self._session.log_metrics:
            _go_first(self, inspect.currentframe())

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, float] | None = None, **kwargs: Any) -> None:
        if logs is not None:
            self._session.forward(logs)  # on the step axis beside the loss and the drift
            if self._session.log_metrics:
                logs.update(self._session.metrics())

    def on_train_end(self, args: TrainingArguments, state: TrainerState,
                     control: TrainerControl, **kwargs: Any) -> None:
        self._session.close("finished")


def _subclass_step(frame: Any) -> CodeType | None:
    """The code of a Trainer subclass's own ``training_step`` (else ``compute_loss``), which
    stands for the backward, step and reset calls the Trainer makes; None for the Trainer's
    own. The Trainer is the ``self`` of a frame calling the event: callbacks are given no
    reference to it."""
    from transformers import Trainer

    f = frame
    for _ in range(6):
        f = f.f_back if f is not None else None
        trainer = f.f_locals.get("self") if f is not None else None
        if isinstance(trainer, Trainer):
            for name in ("training_step", "compute_loss"):
                fn = getattr(type(trainer), name, None)
                if fn is not None and fn is not getattr(Trainer, name):
                    return getattr(fn, "__code__", None)
            return None
    return None


def _go_first(callback: TrainerCallback, frame: Any) -> None:
    """Move ``callback`` to the front of the Trainer's callbacks, so that its additions to
    ``logs`` reach the reporting callbacks, which the Trainer puts before the user's.

    The handler is the ``self`` of the frame calling the event: callbacks are given no
    reference to it.
    """
    caller = frame.f_back if frame is not None else None
    handler = caller.f_locals.get("self") if caller is not None else None
    if not isinstance(handler, CallbackHandler) or callback not in handler.callbacks:
        log.warning("gradwatch: could not find the Trainer's callbacks; the figures reach "
                    "only the reporters listed after GradwatchCallback")
        return
    # A new list: the handler is iterating the old one right now.
    handler.callbacks = [callback, *(c for c in handler.callbacks if c is not callback)]
