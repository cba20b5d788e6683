"""``gradwatch.lightning.GradwatchCallback``: watch a Lightning ``Trainer``'s optimizers.

::

    from gradwatch.lightning import GradwatchCallback
    trainer = Trainer(callbacks=[GradwatchCallback(log="run.jsonl")])

Works with ``lightning`` and with ``pytorch_lightning`` (2.x), whichever the program uses.
Without either, importing this module raises :class:`gradwatch.extras.MissingPackageError`,
an ``ImportError`` whose one sentence names the package to install.

Thread: training (Lightning calls its callbacks there).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gradwatch.extras import LIGHTNING, importable, require


def _lightning_package() -> str:
    """The package the program uses: one already imported, else ``lightning`` if installed."""
    for name in ("lightning", "pytorch_lightning"):
        if name in sys.modules:
            return name
    if importable("lightning") or not importable("pytorch_lightning"):
        require("gradwatch.lightning", LIGHTNING)
        return "lightning"
    return "pytorch_lightning"


if TYPE_CHECKING:
    import torch
    from lightning.pytorch import Callback, LightningModule, Trainer
elif _lightning_package() == "lightning":
    from lightning.pytorch import Callback
else:
    from pytorch_lightning import Callback

from gradwatch.integrations.sessions import CallbackSession, HasSession, run_identity  # noqa: E402

__all__ = ["GradwatchCallback"]

log = logging.getLogger("gradwatch")


class GradwatchCallback(HasSession, Callback):
    """Watches every optimizer the trainer sets up (automatic or manual optimization, one or
    several optimizers) from the start of ``fit`` to its end, and judges every step.

    Optimizers are named as the module's code reaches them: the ``LightningModule``
    attribute holding them (``self.head_opt``), else under manual optimization the variable
    ``training_step`` steps them through (``d_opt``), else ``self.optimizers()`` (with
    several, ``self.optimizers()[i]`` in ``configure_optimizers`` order).
    The run is named after the trainer's logger (its experiment's name, else
    ``<name>/version_<n>``), else the module's class. Under DDP every rank writes its own
    step log (``<stem>.rank<R><suffix>``) of one run: rank 0's run id and name are
    broadcast. The session closes when ``fit`` ends or fails.

    What the module logs with ``self.log`` (``trainer.callback_metrics``) goes on the run's
    step axis too, every ``log_every_n_steps`` batches and after each validation, beside
    the probe's own loss and learning rate (``WatchHandle.log``; tensors are read without a
    device sync).

    Args:
        log: step log path (default: ``gradwatch.jsonl`` in ``trainer.log_dir``). Kept as
            :attr:`step_log`.
        server: gradwatch server URL to stream to.
        run_name: display name of the run (default: from the trainer's logger).
        norms_every: sample gradient norms every N steps (0 = never); judging is every step.
        log_metrics: also hand the latest written step's figures (``gradwatch/drift``,
            ``gradwatch/norm``, ``gradwatch/fresh_norm``, ``gradwatch/findings``) to the
            trainer's loggers, every ``log_every_n_steps`` batches. The values are host
            floats the probe's writer thread has already published: no device sync, no wait.

    Raises:
        TypeError, ValueError: an argument is wrong; the message says how to fix it.
    """

    def __init__(self, log: str | os.PathLike[str] | None = None, server: str | None = None,
                 run_name: str | None = None, norms_every: int = 1,
                 log_metrics: bool = False) -> None:
        super().__init__()
        self._session = CallbackSession(log, server, run_name, norms_every, log_metrics)

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        log_dir = trainer.log_dir or trainer.default_root_dir  # a collective: every rank
        broadcast = trainer.strategy.broadcast if trainer.world_size > 1 else None
        run, name = run_identity(_run_name(trainer, pl_module), broadcast)
        opts = list(trainer.optimizers)
        self._session.open(opts, _labels(pl_module, opts), model=pl_module,
                           default_log=Path(log_dir) / "gradwatch.jsonl", run_name=name,
                           run_id=run,
                           labeler=_Labeler(opts, not pl_module.automatic_optimization))
        # the calls Lightning makes itself are named by the module's training_step
        handle = self._session.handle
        step_fn = getattr(type(pl_module).training_step, "__code__", None)
        if handle is not None and step_fn is not None:
            handle.stand_in(step_fn)
        hook = getattr(type(pl_module).optimizer_zero_grad, "__code__", None)
        if (handle is not None and hook is not None and pl_module.automatic_optimization
                and hook.co_qualname != "LightningModule.optimizer_zero_grad"):
            handle.reset_hook(hook)  # the module's override: where Lightning resets for it

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        every = getattr(trainer, "log_every_n_steps", 50)  # set by Lightning at init
        if not every or ((batch_idx + 1) % every and not trainer.is_last_batch):
            return
        # what the module logged (self.log), on the step axis beside the loss and the drift
        self._session.forward(trainer.callback_metrics)
        if not self._session.log_metrics or not trainer.loggers:
            return
        if metrics := self._session.metrics():
            # Lightning's own x-axis for logged metrics counts batches that stepped, which
            # global_step overcounts with several optimizers.
            step = getattr(trainer.fit_loop.epoch_loop, "_batches_that_stepped",
                           trainer.global_step)
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=step)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking:
            self._session.forward(trainer.callback_metrics)

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._session.close("finished")

    def on_exception(self, trainer: Trainer, pl_module: LightningModule,
                     exception: BaseException) -> None:
        self._session.close("interrupted" if isinstance(exception, KeyboardInterrupt)
                            else "failed")

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit":  # on_fit_end has run; this closes a session it could not
            self._session.close("finished")


def _run_name(trainer: Trainer, pl_module: LightningModule) -> str:
    """The trainer's logger's run: its experiment's name (W&B), else ``name/version_<n>``
    (TensorBoard, CSV), else the module's class name."""
    logger = trainer.logger
    if logger is not None:
        # Lightning creates the experiment in its setup hook, so reading it costs nothing;
        # ranks other than 0 get a dummy without a name.
        experiment_name = getattr(getattr(logger, "experiment", None), "name", None)
        if isinstance(experiment_name, str) and experiment_name:
            return experiment_name
        name, version = getattr(logger, "name", None), getattr(logger, "version", None)
        if name:
            if version is None:
                return str(name)
            return f"{name}/{f'version_{version}' if isinstance(version, int) else version}"
    return type(pl_module).__name__


def _labels(pl_module: LightningModule, opts: Sequence[torch.optim.Optimizer]
            ) -> list[str | None]:
    """Each optimizer's name as an attribute of the module (``self.head_opt``), None where
    the module holds it in none (see :class:`_Labeler`)."""
    import torch

    from gradwatch.probe.watchargs import unwrap

    attrs: dict[int, str] = {}
    for attr, value in vars(pl_module).items():
        # Lightning's own wrapper passes this test too (its class derives from the
        # optimizer's); other wrappers hold the optimizer as an instance attribute.
        held = getattr(value, "__dict__", {})
        if not attr.startswith("_") and (isinstance(value, torch.optim.Optimizer)
                                         or "optimizer" in held or "_optimizer" in held):
            inner = unwrap(value)
            if inner is not None:
                attrs.setdefault(id(inner), attr)
    labels: list[str | None] = [attrs.get(id(o)) for o in opts]
    taken = [x for x in labels if x is not None]
    return [x if x is None or taken.count(x) == 1 else None for x in labels]


class _Labeler:
    """Names an optimizer the module holds in no attribute as the module's code reaches it:
    under manual optimization, the variable ``training_step`` steps it through (``d_opt``,
    read at its first step); else ``self.optimizers()`` (``self.optimizers()[i]`` of
    several), which is how a LightningModule's hooks reach it."""

    def __init__(self, opts: Sequence[torch.optim.Optimizer], manual: bool) -> None:
        self._fallback = {id(o): "self.optimizers()" if len(opts) == 1
                          else f"self.optimizers()[{i}]" for i, o in enumerate(opts)}
        self._wait = {id(o) for o in opts} if manual else set()
        """Optimizers whose first step, not their attach, names them."""

    def __call__(self, opt: torch.optim.Optimizer) -> str | None:
        from gradwatch.probe.names import held_label

        found = held_label(opt)
        if found:
            return found
        if id(opt) in self._wait:
            self._wait.discard(id(opt))
            return None
        return self._fallback.get(id(opt))
