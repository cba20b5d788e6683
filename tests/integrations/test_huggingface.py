"""``gradwatch.huggingface.GradwatchCallback`` on the real ``transformers.Trainer`` with a
config-built tiny GPT-2 on CPU: accumulation, clipping and the Trainer's own zero_grad stay
clean with every step judged; a zero_grad in ``on_pre_optimizer_step`` is a late reset; the
figures reach the reporters through ``on_log``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

from transformers import Trainer, TrainerCallback  # noqa: E402

from gradwatch.huggingface import GradwatchCallback  # noqa: E402
from gradwatch.steplog import read_log  # noqa: E402
from gradwatch.wire import End, Scalars, Step  # noqa: E402
from tests.integrations.conftest import judged, kinds  # noqa: E402
from tests.integrations.hf_models import Tokens, args, tiny_gpt2  # noqa: E402


class _ZeroGradBeforeStep(TrainerCallback):
    """The slip: clears the gradients after clipping, right before ``optimizer.step()``."""

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, model: Any = None,
                              **kwargs: Any) -> None:
        model.zero_grad()


class _Reporter(TrainerCallback):
    """Stands for TensorBoard or W&B: keeps the ``logs`` every ``on_log`` gets."""

    def __init__(self) -> None:
        self.seen: list[dict[str, float]] = []

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None,
               **kwargs: Any) -> None:
        self.seen.append(dict(logs))


class _WriterCaughtUp(TrainerCallback):
    """Stands for a real step's length: the writer thread has written every step by the
    time the step ends (a tiny CPU step is over before the writer's first round)."""

    def __init__(self, cb: GradwatchCallback) -> None:
        self.cb = cb

    def on_step_end(self, *args: Any, **kwargs: Any) -> None:
        if self.cb.handle is not None:
            assert self.cb.handle.writer.settle()


def test_accumulation_clipping_and_the_trainers_zero_grad_are_clean(tmp_path: Path) -> None:
    log = tmp_path / "hf.jsonl"
    reporter = _Reporter()
    cb = GradwatchCallback(log=log, log_metrics=True, run_name="gpt2-tiny")
    t = Trainer(model=tiny_gpt2(), train_dataset=Tokens(n=32),
                args=args(tmp_path / "out", gradient_accumulation_steps=4, max_grad_norm=0.5),
                callbacks=[reporter, _WriterCaughtUp(cb), cb])
    t.train()
    v = judged(log)
    assert v.findings() == []
    assert t.state.global_step == 4  # 16 batches of 2, 4 per step
    assert v.summary()["steps"] == 4 and v.summary()["status"] == "finished"
    steps = [r for r in read_log(log).records if isinstance(r, Step)]
    assert [s.backwards for s in steps] == [4] * 4
    assert all(s.drift == pytest.approx(1.0) for s in steps)
    assert read_log(log).header.run_name == "gpt2-tiny"
    assert cb.handle is None
    assert all(s.loss is not None and s.lr is not None for s in steps)
    # What the Trainer logs reaches the run's step axis too.
    logged = {k for r in read_log(log).records if isinstance(r, Scalars) for k in r.values}
    trainer_logged = {k for m in reporter.seen for k, v in m.items()
                      if not k.startswith("gradwatch/") and isinstance(v, (int, float))}
    assert logged and logged <= trainer_logged
    # The reporter is listed first, yet it got the figures (of steps the log holds).
    handed = [m for m in reporter.seen if "gradwatch/drift" in m]
    assert handed
    for m in handed:
        assert m["gradwatch/findings"] == 0.0
        assert any(s.norm == m["gradwatch/norm"] and s.fresh_norm == m["gradwatch/fresh_norm"]
                   for s in steps)


class _MyTrainer(Trainer):
    """A Trainer subclass with its own loss: its lines stand for the Trainer's calls."""

    def compute_loss(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        return super().compute_loss(model, inputs, *args, **kwargs)


def test_zero_grad_between_backward_and_step_is_a_late_reset(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "hf.jsonl"
    t = _MyTrainer(model=tiny_gpt2(), train_dataset=Tokens(n=16),
                   args=args(tmp_path / "out", gradient_accumulation_steps=2),
                   callbacks=[GradwatchCallback(log=log), _ZeroGradBeforeStep()])
    t.train()
    v = judged(log)
    assert kinds(v) == {("late_reset", "self.optimizer")}
    late = v.findings()[0]
    # the lines are the user's: the callback's reset, and the subclass's compute_loss for
    # the backward and the step the Trainer makes; never accelerate's or transformers'
    assert [(w.role, w.function) for w in late.where] == [
        ("reset", "_ZeroGradBeforeStep.on_pre_optimizer_step"),
        ("backward", "_MyTrainer.compute_loss"), ("step", "_MyTrainer.compute_loss")]
    assert all(w.file == __file__ for w in late.where)
    assert "site-packages" not in late.fix
    assert "gradwatch: 4 optimizer steps, 1 finding: late_reset on self.optimizer" in \
        capfd.readouterr().err
    assert late.first_step == 0 and late.steps == t.state.global_step == 4
    assert any(p.startswith("transformer.h.0.") for p in late.params)  # the model's names


def test_default_step_log_and_run_name_follow_the_output_dir(tmp_path: Path) -> None:
    out = tmp_path / "my-run"
    Trainer(model=tiny_gpt2(), train_dataset=Tokens(n=8),
            args=args(out, max_steps=2), callbacks=[GradwatchCallback()]).train()
    assert read_log(out / "gradwatch.jsonl").header.run_name == "my-run"
    assert judged(out / "gradwatch.jsonl").summary()["steps"] == 2


def test_train_again_after_a_failed_train_closes_the_first_run(tmp_path: Path) -> None:
    class _Boom(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 2:
                raise RuntimeError("boom")

    log = tmp_path / "hf.jsonl"
    cb = GradwatchCallback(log=log)
    boom = _Boom()
    t = Trainer(model=tiny_gpt2(), train_dataset=Tokens(n=16),
                args=args(tmp_path / "out", max_steps=3), callbacks=[cb, boom])
    with pytest.raises(RuntimeError, match="boom"):
        t.train()
    first = cb.handle
    assert first is not None  # the Trainer told no callback that train() failed
    t.remove_callback(boom)
    t.args.max_steps = 2
    log2 = tmp_path / "hf2.jsonl"
    cb._session.step_log = log2
    t.train()
    end = read_log(log).records[-1]
    assert isinstance(end, End) and end.status == "failed" and end.steps == 2
    assert judged(log2).summary()["status"] == "finished"


def test_wrong_arguments_fail_when_the_callback_is_built() -> None:
    with pytest.raises(ValueError, match="server= must be a URL"):
        GradwatchCallback(server="localhost:8765")
