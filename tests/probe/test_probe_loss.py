"""The loss and learning rate each step records with no code, and ``handle.log``: values
compared with what the training loop itself computed."""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

import gradwatch
from gradwatch import encoding
from gradwatch.probe import losses, records
from gradwatch.steplog import read_log
from gradwatch.wire import Scalars, Step
from tests.probe.probe_helpers import loss_of, mlp


def _recorded(losses: list[float]) -> list[float]:
    """The losses as a step records them: a float32 value (one backward's) to float32's 9
    digits, which round back to it exactly; a sum in float64 as it is."""
    out = [encoding.at_float32_precision(x) if encoding.is_float32([x]) else x for x in losses]
    assert all(encoding.as_float32(y) == x for x, y in zip(losses, out, strict=True)
               if encoding.is_float32([x]))
    return out


def _steps(path: Path, opt: str | None = None) -> list[Step]:
    return [r for r in read_log(path).records
            if isinstance(r, Step) and (opt is None or r.opt == opt)]


def test_loss_is_the_sum_of_the_steps_backwards_as_passed(tmp_path: Path) -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    want: list[float] = []
    lrs: list[float] = []
    with gradwatch.watch(opt, log=tmp_path / "a.jsonl"):
        for i in range(6):
            opt.zero_grad()
            accum = 1 if i < 2 else 3  # plain steps, then an accumulation window
            total = 0.0
            for j in range(accum):
                loss = loss_of(model, 10 * i + j) / accum
                loss.backward()
                total += loss.item()
            want.append(total)
            lrs.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
    steps = _steps(tmp_path / "a.jsonl")
    assert [s.loss for s in steps] == _recorded(want)  # float32 values, summed in order
    assert [s.lr for s in steps] == [[x] for x in lrs]
    assert lrs[0] != lrs[-1]  # the scheduler did change it


def test_loss_is_the_value_at_backward_when_changed_in_place_later(tmp_path: Path) -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    want = []
    with gradwatch.watch(opt, log=tmp_path / "a.jsonl"):
        running = None
        for i in range(3):
            opt.zero_grad()
            loss = loss_of(model, i)
            loss.backward()
            want.append(loss.item())
            if running is None:
                running = loss.detach()  # shares storage with the loss ...
            else:
                running += loss.detach()  # ... which this changes in place
            opt.step()
    assert [s.loss for s in _steps(tmp_path / "a.jsonl")] == _recorded(want)


def test_grad_scaler_root_is_read_before_scaling(tmp_path: Path) -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    want = []
    with gradwatch.watch(opt, log=tmp_path / "a.jsonl"):
        for i in range(4):
            opt.zero_grad()
            loss = loss_of(model, i) / 2
            scaler.scale(loss).backward()
            loss2 = loss_of(model, 100 + i) / 2
            scaler.scale(loss2).backward()
            want.append(loss.item() + loss2.item())
            scaler.step(opt)
            scaler.update()
    got = [s.loss for s in _steps(tmp_path / "a.jsonl")]
    assert got == _recorded(want)


def test_each_optimizer_gets_the_loss_of_its_own_backward(tmp_path: Path) -> None:
    g, d = mlp(1), mlp(2, n_in=2, n_out=1)
    g_opt = torch.optim.Adam(g.parameters(), lr=1e-3)
    d_opt = torch.optim.SGD(d.parameters(), lr=0.05)
    want: dict[str, list[float]] = {"G": [], "D": []}
    with gradwatch.watch([g_opt, d_opt], names=["G", "D"], log=tmp_path / "a.jsonl"):
        for _ in range(3):
            x = torch.randn(8, 4)
            d_opt.zero_grad()
            d_loss = d(g(x).detach()).mean()
            d_loss.backward()
            d_opt.step()
            g_opt.zero_grad()
            g_loss = -d(g(x)).mean()
            g_loss.backward()
            g_opt.step()
            want["D"].append(d_loss.item())
            want["G"].append(g_loss.item())
    path = tmp_path / "a.jsonl"
    assert [s.loss for s in _steps(path, "D")] == _recorded(want["D"])
    assert [s.loss for s in _steps(path, "G")] == _recorded(want["G"])
    assert [s.lr for s in _steps(path, "G")] == [[1e-3]] * 3


def test_two_optimizers_stepping_on_one_backward_both_record_its_loss(
        tmp_path: Path) -> None:
    encoder, head = mlp(1), mlp(2, n_in=2, n_out=1)
    enc_opt = torch.optim.SGD(encoder.parameters(), lr=0.01)
    head_opt = torch.optim.Adam(head.parameters(), lr=1e-3)
    want = []
    with gradwatch.watch([enc_opt, head_opt], names=["enc", "head"],
                         log=tmp_path / "a.jsonl"):
        for _ in range(3):
            enc_opt.zero_grad()
            head_opt.zero_grad()
            loss = head(encoder(torch.randn(8, 4))).pow(2).mean()
            loss.backward()
            want.append(loss.item())
            enc_opt.step()  # the first takes the backward's value ...
            head_opt.step()  # ... the second finds it among those taken
    path = tmp_path / "a.jsonl"
    assert [s.loss for s in _steps(path, "enc")] == _recorded(want)
    assert [s.loss for s in _steps(path, "head")] == _recorded(want)


def test_non_scalar_roots_leave_the_loss_unknown_and_training_goes_on(tmp_path: Path) -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with gradwatch.watch(opt, log=tmp_path / "a.jsonl") as h:
        for _ in range(2):
            opt.zero_grad()
            out = model(torch.randn(4, 4))
            out.backward(torch.ones_like(out))  # a tensor root: no loss to speak of
            opt.step()
        opt.zero_grad()
        loss = loss_of(model, 5)
        loss.backward()
        opt.step()
        assert h.disabled is None
    steps = _steps(tmp_path / "a.jsonl")
    assert [s.loss is None for s in steps] == [True, True, False]


def test_a_loss_that_cannot_be_read_turns_the_loss_off_not_the_probe(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with gradwatch.watch(opt, log=tmp_path / "a.jsonl") as handle:
        opt.zero_grad()
        loss_of(model, 0).backward()
        opt.step()

        def unreadable(self: torch.Tensor) -> float:
            raise RuntimeError("no value here")

        monkeypatch.setattr(torch.Tensor, "item", unreadable)
        for i in range(1, 3):
            opt.zero_grad()
            loss_of(model, i).backward()
            opt.step()
        monkeypatch.undo()
        assert handle.tracker.on and not handle.tracker.roots.on
    steps = _steps(tmp_path / "a.jsonl")
    assert len(steps) == 3  # every step still judged and recorded
    assert steps[0].loss is not None and [s.loss for s in steps[1:]] == [None, None]


def test_backwards_no_step_takes_keep_their_losses_bounded(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.ones(1, 2)
    with gradwatch.watch(opt, log=tmp_path / "a.jsonl") as handle:
        for _ in range(3 * 1024 + 5):  # one accumulation window, far longer than kept
            model(x).sum().backward()
        waiting = len(handle.tracker.roots.waiting)
        opt.step()
        opt.zero_grad()
        loss = model(x).sum()
        loss.backward()
        opt.step()
    assert losses._KEEP <= waiting <= losses._KEEP + 1024
    steps = _steps(tmp_path / "a.jsonl")
    assert steps[0].loss is None  # its first backwards' values were forgotten
    assert steps[1].loss == _recorded([loss.item()])[0]


def test_a_long_run_keeps_few_taken_losses_and_records_each(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.ones(1, 2)
    want = []
    with gradwatch.watch(opt, log=tmp_path / "a.jsonl") as handle:
        for _ in range(2 * 1024 + 5):
            opt.zero_grad()
            loss = model(x).sum()
            loss.backward()
            want.append(loss.item())
            opt.step()
        recent = len(handle.tracker.roots.recent)
    assert recent <= losses._RECENT + 1024
    assert [s.loss for s in _steps(tmp_path / "a.jsonl")] == _recorded(want)


def test_nan_loss_is_data(tmp_path: Path) -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with gradwatch.watch(opt, log=tmp_path / "a.jsonl"):
        opt.zero_grad()
        (loss_of(model, 0) * math.nan).backward()
        opt.step()
    (s,) = _steps(tmp_path / "a.jsonl")
    assert s.loss is not None and math.isnan(s.loss)
    assert '"loss":"NaN"' in (tmp_path / "a.jsonl").read_text()


def test_tensor_and_missing_learning_rates() -> None:
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=torch.tensor(0.25))
    assert losses.learning_rates(opt) == [0.25]
    opt.param_groups[0]["lr"] = None
    assert losses.learning_rates(opt) is None
    opt.param_groups[0]["lr"] = "fast"
    assert losses.learning_rates(opt) is None


def test_each_step_records_the_learning_rates_its_groups_held(tmp_path: Path) -> None:
    """The usual single float lr, a tensor lr, two groups, an int lr: what each step
    records is what the optimizer held at that step."""
    model = mlp()
    head = list(model.parameters())[-2:]
    body = list(model.parameters())[:-2]
    opt = torch.optim.SGD([{"params": body}], lr=0.1)
    held: list[list[float] | None] = []
    with gradwatch.watch(opt, log=tmp_path / "a.jsonl", norms_every=0):
        for i in range(4):
            if i == 1:
                opt.param_groups[0]["lr"] = torch.tensor(0.25)
            if i == 2:
                opt.param_groups[0]["lr"] = 0.05
                opt.add_param_group({"params": head, "lr": 0.5})
            if i == 3:
                opt.param_groups[1]["lr"] = 2  # an int: a number all the same
            opt.zero_grad()
            loss_of(model, i).backward()
            held.append(losses.learning_rates(opt))
            opt.step()
    assert held == [[0.1], [0.25], [0.05, 0.5], [0.05, 2.0]]
    assert [s.lr for s in _steps(tmp_path / "a.jsonl")] == held


class _FakeEvent:
    log: list[str] = []

    def record(self, stream: Any = None) -> None:
        self.log.append("record")

    def synchronize(self) -> None:
        self.log.append("synchronize")


class _FakeCuda:
    """A 0-dim CUDA tensor as the capture sees one; reading it on the device side fails."""

    def __init__(self, value: float) -> None:
        self.value = value
        self.device = torch.device("cuda", 0)
        self.copies: list[tuple[Any, bool]] = []

    def numel(self) -> int:
        return 1

    def is_floating_point(self) -> bool:
        return True

    def detach(self) -> _FakeCuda:
        return self

    def reshape(self, shape: Any) -> _FakeCuda:
        return self

    def item(self) -> float:
        raise AssertionError("a device read on the training thread (a host-device sync)")

    def to(self, device: Any, non_blocking: bool = False) -> torch.Tensor:
        self.copies.append((device, non_blocking))
        return torch.tensor(self.value)


def test_cuda_root_is_copied_without_a_sync_and_read_by_the_writer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _FakeEvent.log = []
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: "stream")
    root = _FakeCuda(2.5)
    value = losses.capture(root)  # the training thread: copy enqueued, event recorded
    assert isinstance(value, losses.DeviceRead)
    assert root.copies == [("cpu", True)]
    assert _FakeEvent.log == ["record"]
    got: list[float | None] = []
    writer = threading.Thread(target=lambda: got.append(records.loss_of([value, 0.5])))
    writer.start()
    writer.join()
    assert got == [3.0]
    assert _FakeEvent.log == ["record", "synchronize"]  # waited on the writer thread only


def test_scaled_cuda_root_copies_the_unscaled_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: "stream")
    scaled = torch.tensor(4096.0)
    unscaled = _FakeCuda(4.0)
    setattr(scaled, losses.UNSCALED, unscaled)
    value = losses.capture(scaled)
    assert isinstance(value, losses.DeviceRead) and unscaled.copies == [("cpu", True)]
    assert records.loss_of([value]) == 4.0


def test_handle_log_writes_scalars_at_the_latest_step(tmp_path: Path) -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with gradwatch.watch(opt, log=tmp_path / "a.jsonl") as h:
        h.log(before=1)
        for i in range(3):
            opt.zero_grad()
            loss_of(model, i).backward()
            opt.step()
            h.log(acc=i / 10, blowup=math.inf, t=torch.tensor(i))
        h.log(step=10, val_loss=0.5)
        with pytest.raises(TypeError, match="takes a number"):
            h.log(acc="0.9")
        with pytest.raises(TypeError, match="one real number"):
            h.log(acc=torch.ones(3))
        with pytest.raises(TypeError, match="int or None"):
            h.log(step=2.0, acc=1)
        with pytest.raises(ValueError, match="between 0"):
            h.log(step=-1, acc=1)
        with pytest.raises(TypeError, match="at least one"):
            h.log()
    h.log(after=1)  # closed: nothing, no error
    got = [(r.step, r.opt, r.values) for r in read_log(tmp_path / "a.jsonl").records
           if isinstance(r, Scalars)]
    assert got == [(0, None, {"before": 1.0}),
                   (0, "SGD#0", {"acc": 0.0, "blowup": math.inf, "t": 0.0}),
                   (1, "SGD#0", {"acc": 0.1, "blowup": math.inf, "t": 1.0}),
                   (2, "SGD#0", {"acc": 0.2, "blowup": math.inf, "t": 2.0}),
                   (10, None, {"val_loss": 0.5})]
