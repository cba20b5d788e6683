"""``gradwatch.lightning.GradwatchCallback`` on real Lightning training (CPU, tiny modules):
clean runs stay clean with every optimizer step judged, a broken GAN is caught, the run is
named and its optimizers too, the session closes when fit fails, figures reach the trainer's
loggers, and two DDP ranks write one run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lightning")

import torch  # noqa: E402
from lightning.pytorch import Callback, Trainer  # noqa: E402
from lightning.pytorch.loggers import CSVLogger, Logger  # noqa: E402

from gradwatch.lightning import GradwatchCallback  # noqa: E402
from gradwatch.steplog import read_log  # noqa: E402
from gradwatch.wire import End, Header, OptimizerInfo, Scalars, Step  # noqa: E402
from tests.integrations.conftest import judged, kinds  # noqa: E402
from tests.integrations.lit_models import (  # noqa: E402
    Gan,
    NoReset,
    Regressor,
    noise_data,
    regression_data,
)


def trainer(tmp_path: Path, cb: GradwatchCallback, **kw: Any) -> Trainer:
    base: dict[str, Any] = dict(max_epochs=1, callbacks=[cb], logger=False,
                                enable_progress_bar=False, enable_checkpointing=False,
                                enable_model_summary=False, accelerator="cpu",
                                default_root_dir=str(tmp_path))
    base.update(kw)
    return Trainer(**base)


def test_automatic_optimization_with_accumulation_and_clipping_is_clean(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "run.jsonl"
    cb = GradwatchCallback(log=log)
    t = trainer(tmp_path, cb, accumulate_grad_batches=4, gradient_clip_val=0.5, max_epochs=2)
    t.fit(Regressor(), regression_data(n=64, batch=4))  # 16 batches: 4 steps an epoch
    v = judged(log)
    assert v.findings() == []
    assert t.global_step == 8
    assert v.summary()["steps"] == 8  # every step judged
    assert v.summary()["status"] == "finished"
    steps = [r for r in read_log(log).records if isinstance(r, Step)]
    assert [s.backwards for s in steps] == [4] * 8  # each step read its whole window
    assert all(s.drift == pytest.approx(1.0) for s in steps)
    assert cb.step_log == log and cb.handle is None  # closed when fit ended
    # The loss and lr with no code, and what the module logs, on the same step axis.
    assert all(s.loss is not None and s.loss > 0 and s.lr == [pytest.approx(0.05)]
               for s in steps), [(s.loss, s.lr) for s in steps]
    logged = [r for r in read_log(log).records if isinstance(r, Scalars)]
    assert logged and all("train_loss" in r.values for r in logged)
    # the verdict, on a line of its own at the end of fit, whatever logging is set to
    assert (f"\ngradwatch: 8 optimizer steps, no gradient-reset bug found (step log: {log})\n"
            in "\n" + capfd.readouterr().err)


def test_an_empty_zero_grad_hook_is_found_at_the_modules_lines(tmp_path: Path) -> None:
    """Lightning makes backward, step and zero_grad itself: the finding names the optimizer
    as the module's hooks reach it and names the module's training_step, never a line of
    Lightning's."""
    log = tmp_path / "noreset.jsonl"
    trainer(tmp_path, GradwatchCallback(log=log), max_steps=4).fit(NoReset(),
                                                                  regression_data())
    (f,) = judged(log).findings()
    assert (f.kind, f.optimizer) == ("missed_reset", "self.optimizers()")
    # first the empty hook, at its own line: the line to change; then training_step
    assert [(w.role, w.function) for w in f.where] == [
        ("reset", "NoReset.optimizer_zero_grad"), ("backward", "Regressor.training_step"),
        ("step", "Regressor.training_step")], f.where
    hook = NoReset.optimizer_zero_grad.__code__.co_firstlineno
    assert all(w.file.endswith("lit_models.py") for w in f.where)
    assert f.where[0].line == hook
    assert f"optimizer_zero_grad hook at {f.where[0].file}:{hook}" in f.fix, f.fix
    assert "site-packages" not in f.fix


def test_manual_optimization_gan_is_clean_and_its_optimizers_are_named(
        tmp_path: Path) -> None:
    log = tmp_path / "gan.jsonl"
    t = trainer(tmp_path, GradwatchCallback(log=log))
    t.fit(Gan(), noise_data(n=48, batch=8))  # 6 batches, two optimizer steps each
    v = judged(log)
    assert v.findings() == []
    assert v.summary()["steps"] == 12 == t.global_step
    # named as training_step holds them (g_opt, d_opt = self.optimizers())
    assert v.summary()["optimizers"] == ["d_opt", "g_opt"]


def test_gan_without_the_discriminators_zero_grad_is_caught(tmp_path: Path) -> None:
    log = tmp_path / "gan.jsonl"
    t = trainer(tmp_path, GradwatchCallback(log=log))
    t.fit(Gan(forget_d_zero_grad=True), noise_data(n=48, batch=8))
    v = judged(log)
    assert ("missed_reset", "d_opt") in kinds(v)
    assert all(f.optimizer == "d_opt" for f in v.findings())
    missed = next(f for f in v.findings() if f.kind == "missed_reset")
    # the fix pastes: d_opt is the variable training_step steps; its lines are the module's
    assert "d_opt.zero_grad()" in missed.fix, missed.fix
    assert missed.where and all(w.file.endswith("lit_models.py") for w in missed.where), \
        missed.where
    missed = next(f for f in v.findings() if f.kind == "missed_reset")
    assert missed.first_step == 1 and missed.steps == 5  # every step after the first
    assert any(p.startswith("discriminator.") for p in missed.params)


class _Named(Regressor):
    """Two optimizers over parts of one child module (no child to name them after); the
    module keeps the second as ``self.head_opt``."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        self.head_opt = torch.optim.SGD(self.net[2].parameters(), lr=0.05)
        return [torch.optim.SGD(self.net[0].parameters(), lr=0.05), self.head_opt]

    def training_step(self, batch: Any, batch_idx: int) -> None:
        opts = self.optimizers()  # Lightning's wrappers
        for opt in opts:  # type: ignore[union-attr]
            opt.zero_grad()
        self.manual_backward(super().training_step(batch, batch_idx))
        for opt in opts:  # type: ignore[union-attr]
            opt.step()


def test_optimizers_held_by_the_module_take_its_attribute_names(tmp_path: Path) -> None:
    log = tmp_path / "named.jsonl"
    trainer(tmp_path, GradwatchCallback(log=log), max_steps=3).fit(_Named(), regression_data())
    v = judged(log)
    # the one the module holds is named by its attribute; the other as the loop steps it
    assert v.summary()["optimizers"] == ["head_opt", "opt"]


def test_the_run_is_named_after_the_trainers_logger(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    csv = CSVLogger(str(tmp_path / "logs"), name="exp")
    trainer(tmp_path, GradwatchCallback(log=log), logger=csv, max_steps=2).fit(
        Regressor(), regression_data())
    assert read_log(log).header.run_name == "exp/version_0"
    log2 = tmp_path / "given.jsonl"
    trainer(tmp_path, GradwatchCallback(log=log2, run_name="mine"), logger=csv,
            max_steps=2).fit(Regressor(), regression_data())
    assert read_log(log2).header.run_name == "mine"


def test_without_log_the_step_log_goes_to_the_trainers_log_dir(tmp_path: Path) -> None:
    csv = CSVLogger(str(tmp_path / "logs"), name="exp")
    trainer(tmp_path, GradwatchCallback(), logger=csv, max_steps=2).fit(
        Regressor(), regression_data())
    assert judged(tmp_path / "logs" / "exp" / "version_0" / "gradwatch.jsonl").summary()[
        "steps"] == 2


class _Boom(Regressor):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if batch_idx == 3:
            raise RuntimeError("boom")
        return super().training_step(batch, batch_idx)


def test_a_fit_that_fails_closes_the_session_as_failed(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    cb = GradwatchCallback(log=log)
    with pytest.raises(RuntimeError, match="boom"):
        trainer(tmp_path, cb).fit(_Boom(), regression_data())
    assert cb.handle is None
    records = read_log(log).records
    assert isinstance(records[-1], End) and records[-1].status == "failed"
    assert records[-1].steps == 3
    import torch.optim as optim  # the wrappers are gone with the session

    assert not hasattr(optim.Optimizer.zero_grad, "__gradwatch_original__")


class _Recorder(Logger):
    """A logger that keeps what it is given, as TensorBoard or W&B would write it."""

    def __init__(self) -> None:
        super().__init__()
        self.logged: list[tuple[int | None, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "rec"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.logged.append((step, dict(metrics)))


class _WriterCaughtUp(Callback):
    """Stands for a real step's length: the writer thread has written every step by the
    time the batch ends (a tiny CPU step is over before the writer's first round)."""

    def __init__(self, cb: GradwatchCallback) -> None:
        self.cb = cb

    def on_train_batch_end(self, *args: Any, **kwargs: Any) -> None:
        if self.cb.handle is not None:
            assert self.cb.handle.writer.settle()


def test_log_metrics_hands_the_latest_written_steps_figures_to_the_loggers(
        tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    rec = _Recorder()
    cb = GradwatchCallback(log=log, log_metrics=True)
    t = trainer(tmp_path, cb, logger=rec, log_every_n_steps=1, max_epochs=3,
                callbacks=[_WriterCaughtUp(cb), cb])
    t.fit(Gan(forget_d_zero_grad=True), noise_data(n=48, batch=8))
    ours = [(s, m) for s, m in rec.logged if any(k.startswith("gradwatch/") for k in m)]
    assert ours, rec.logged
    steps = [r for r in read_log(log).records if isinstance(r, Step)]
    # the figures are named as the findings name the optimizers (the last announcement's)
    label = {i.opt: i.label or i.opt for i in read_log(log).records
             if isinstance(i, OptimizerInfo)}
    for _, m in ours:
        for opt in ("d_opt", "g_opt"):
            if f"gradwatch/{opt}/drift" in m:  # the figures of one step in the log
                assert any(label[s.opt] == opt and s.drift == m[f"gradwatch/{opt}/drift"]
                           and s.norm == m[f"gradwatch/{opt}/norm"]
                           and s.fresh_norm == m[f"gradwatch/{opt}/fresh_norm"]
                           for s in steps)
        assert all(isinstance(v, float) for v in m.values())
    assert ours[-1][1]["gradwatch/findings"] == 2.0  # missed_reset and the leak
    assert max(m.get("gradwatch/d_opt/drift", 0.0) for _, m in ours) > 1.5


def test_without_log_metrics_nothing_reaches_the_loggers(tmp_path: Path) -> None:
    rec = _Recorder()
    trainer(tmp_path, GradwatchCallback(log=tmp_path / "r.jsonl"), logger=rec,
            log_every_n_steps=1, max_steps=4).fit(Regressor(), regression_data())
    assert rec.logged and not any(k.startswith("gradwatch/") for _, m in rec.logged
                                  for k in m)


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(log="/"), "is a directory"),
    (dict(server="127.0.0.1:8765"), "must be a URL"),
    (dict(norms_every=-1), "norms_every= must be an int >= 0"),
    (dict(log_metrics="yes"), "log_metrics= must be True or False"),
])
def test_wrong_arguments_fail_when_the_callback_is_built(kwargs: dict[str, Any],
                                                         message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        GradwatchCallback(**kwargs)


def test_ddp_ranks_write_one_run_each_rank_judged(tmp_path: Path) -> None:
    """Two CPU processes (``ddp_spawn``, gloo): each rank writes its step log, tagged with its
    rank, of one run (rank 0's id and name); the discriminator's missing zero_grad is caught
    on both ranks and the generator stays clean."""
    from lightning.pytorch.strategies import DDPStrategy

    log = tmp_path / "run.jsonl"
    t = trainer(tmp_path, GradwatchCallback(log=log, run_name="gan-ddp"), devices=2,
                strategy=DDPStrategy(start_method="spawn", find_unused_parameters=True,
                                     process_group_backend="gloo"))
    t.fit(Gan(forget_d_zero_grad=True), noise_data(n=48, batch=8))
    headers: list[Header] = []
    for rank in (0, 1):
        path = tmp_path / f"run.rank{rank}.jsonl"
        headers.append(read_log(path).header)
        v = judged(path)
        assert v.summary()["steps"] == 6  # 3 batches per rank, two optimizers each
        assert kinds(v) >= {("missed_reset", "d_opt")}
        assert all(f.optimizer == "d_opt" for f in v.findings())
    assert [(h.rank, h.world_size) for h in headers] == [(0, 2), (1, 2)]
    assert headers[0].run == headers[1].run
    assert {h.run_name for h in headers} == {"gan-ddp"}
    assert not log.exists()
