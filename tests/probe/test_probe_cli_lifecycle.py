"""``gradwatch run`` finds what no optimizer holds with no model given: loops that update
their parameters by hand (pytorch/examples' regression and word_language_model) and the two
lifecycle findings, through the real command line and ``gradwatch check``."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from gradwatch.steplog import read_log
from gradwatch.wire import OptimizerInfo, Step
from tests.probe.test_probe_cli import _run

REGRESSION = textwrap.dedent('''
    # pytorch/examples regression/main.py, its update and reset as they are
    import sys
    from itertools import count
    import torch
    import torch.nn.functional as F

    POLY_DEGREE = 4
    torch.manual_seed(0)
    W_target = torch.randn(POLY_DEGREE, 1) * 5
    b_target = torch.randn(1) * 5

    def make_features(x):
        x = x.unsqueeze(1)
        return torch.cat([x ** i for i in range(1, POLY_DEGREE+1)], 1)

    def get_batch(batch_size=32):
        random = torch.randn(batch_size)
        x = make_features(random)
        return x, x.mm(W_target) + b_target.item()

    fc = torch.nn.Linear(W_target.size(0), 1)
    for batch_idx in count(1):
        batch_x, batch_y = get_batch()
        if "--bug" not in sys.argv:
            fc.zero_grad()
        output = F.smooth_l1_loss(fc(batch_x), batch_y)
        loss = output.item()
        output.backward()
        for param in fc.parameters():
            param.data.add_(-0.1 * param.grad)
        if loss < 1e-3 or batch_idx >= 30:
            break
    print('Loss: {:.6f} after {} batches'.format(loss, batch_idx))
''')

WORD_LM = textwrap.dedent('''
    # the training step of pytorch/examples word_language_model/main.py, on a tiny LSTM
    import sys
    import torch

    class RNNModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = torch.nn.Embedding(30, 8)
            self.rnn = torch.nn.LSTM(8, 8, 2)
            self.decoder = torch.nn.Linear(8, 30)

        def forward(self, x, hidden):
            output, hidden = self.rnn(self.encoder(x), hidden)
            return self.decoder(output), hidden

    torch.manual_seed(0)
    model = RNNModel()
    criterion = torch.nn.NLLLoss()
    lr, hidden = 20.0, None
    for i in range(10):
        data = torch.randint(0, 30, (6, 4))
        targets = torch.randint(0, 30, (24,))
        if hidden is not None:
            hidden = tuple(h.detach() for h in hidden)
        if "--bug" not in sys.argv:
            model.zero_grad()
        output, hidden = model(data, hidden)
        loss = criterion(torch.log_softmax(output.view(-1, 30), 1), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
''')

PLAIN = textwrap.dedent('''
    # plain tensors as parameters, no torch.optim: reset, backward, update under no_grad
    import sys
    import torch

    torch.manual_seed(0)
    W = torch.randn(4, 2, requires_grad=True)
    b = torch.zeros(2, requires_grad=True)
    lr = 0.1
    for i in range(20):
        x, y = torch.randn(8, 4), torch.randn(8, 2)
        loss = ((x @ W + b - y) ** 2).mean()
        if W.grad is not None and "--bug" not in sys.argv:
            W.grad.zero_()
            b.grad.zero_()
        loss.backward()
        with torch.no_grad():
            W -= lr * W.grad
            b -= lr * b.grad
''')

LIFECYCLE = textwrap.dedent('''
    import copy, sys
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone = torch.nn.Linear(4, 8)
            self.head = torch.nn.Linear(8, 2)

        def forward(self, x):
            return self.head(torch.tanh(self.backbone(x)))

    torch.manual_seed(0)
    net = Net()
    if "--copy" in sys.argv:
        opt = torch.optim.Adam(copy.deepcopy(net).parameters(), lr=1e-3)
    else:
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
        net.head = torch.nn.Linear(8, 2)  # replaced after the optimizer was built
    for i in range(12):
        opt.zero_grad()
        x = torch.randn(16, 4)
        net(x).pow(2).mean().backward()
        opt.step()
''')


def _script(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "train.py"
    p.write_text(text)
    return p


def _run_by_hand(tmp_path: Path, text: str, bug: bool) -> tuple[Any, list[Step], OptimizerInfo]:
    """``gradwatch run`` on ``text`` (with ``--bug`` when ``bug``): the result, the steps
    and the first optimizer's record."""
    script = _script(tmp_path, text)
    log = tmp_path / "hand.jsonl"
    r = _run(["run", "--log", str(log), "--", str(script), *(["--bug"] if bug else [])],
             tmp_path)
    assert r.returncode == 0, r.stderr
    records = read_log(log).records
    info = next(x for x in records if isinstance(x, OptimizerInfo))
    return r, [s for s in records if isinstance(s, Step)], info


def _check_json(log: Path, tmp_path: Path) -> tuple[int, dict[str, Any]]:
    c = _run(["check", "--json", str(log)], tmp_path)
    return c.returncode, json.loads(c.stdout)


@pytest.mark.parametrize("bug", [False, True])
def test_regression_example_under_run(tmp_path: Path, bug: bool) -> None:
    script = _script(tmp_path, REGRESSION)
    log = tmp_path / "reg.jsonl"
    r = _run(["run", "--log", str(log), "--", str(script), *(["--bug"] if bug else [])],
             tmp_path)
    assert r.returncode == 0, r.stderr
    assert "after 30 batches" in r.stdout
    assert "gradwatch: 30 optimizer steps" in r.stderr
    steps = [s for s in read_log(log).records if isinstance(s, Step)]
    assert len(steps) == 30 and {s.opt for s in steps} == {"manual"}
    info = next(x for x in read_log(log).records if isinstance(x, OptimizerInfo))
    assert info.manual and sorted(info.params) == ["bias", "weight"]  # found via gc
    code, out = _check_json(log, tmp_path)
    assert out["summary"]["manual_steps"] == 30
    if bug:
        assert code == 1 and "missed_reset on manual, from step 1 (29 steps)" in r.stderr
        assert [(f["kind"], f["optimizer"]) for f in out["findings"]] == [
            ("missed_reset", "manual")]
    else:
        assert code == 0 and "no gradient-reset bug found" in r.stderr


@pytest.mark.parametrize("bug", [False, True])
def test_word_language_model_under_run(tmp_path: Path, bug: bool) -> None:
    script = _script(tmp_path, WORD_LM)
    log = tmp_path / "wlm.jsonl"
    r = _run(["run", "--log", str(log), "--", str(script), *(["--bug"] if bug else [])],
             tmp_path)
    assert r.returncode == 0, r.stderr
    assert "gradwatch: 10 optimizer steps" in r.stderr
    code, out = _check_json(log, tmp_path)
    kinds = [(f["kind"], f["optimizer"], f["first_step"]) for f in out["findings"]]
    assert kinds == ([("missed_reset", "manual", 1)] if bug else [])
    if bug:
        assert "encoder.weight" in out["findings"][0]["params"]


@pytest.mark.parametrize("bug", [False, True])
def test_plain_tensors_by_hand_under_run(tmp_path: Path, bug: bool) -> None:
    """Every one of the 20 updates by hand is a step, numbered 0..19, each applying one
    backward (the first is not merged into a later one, the last closes at exit)."""
    r, steps, info = _run_by_hand(tmp_path, PLAIN, bug)
    assert "gradwatch: 20 optimizer steps" in r.stderr
    assert [(s.opt, s.step, s.backwards) for s in steps] == [
        ("manual", i, 1) for i in range(20)]
    assert info.manual and sorted(info.params) == ["W", "b"]
    code, out = _check_json(tmp_path / "hand.jsonl", tmp_path)
    assert out["summary"]["manual_steps"] == 20
    kinds = [(f["kind"], f["optimizer"], f["first_step"]) for f in out["findings"]]
    assert kinds == ([("missed_reset", "manual", 1)] if bug else [])
    assert code == (1 if bug else 0)


@pytest.mark.parametrize("how", ["replaced", "copy"])
def test_lifecycle_findings_under_run(tmp_path: Path, how: str) -> None:
    script = _script(tmp_path, LIFECYCLE)
    log = tmp_path / "life.jsonl"
    r = _run(["run", "--log", str(log), "--", str(script),
              *(["--copy"] if how == "copy" else [])], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "untrained_params" in r.stderr
    code, out = _check_json(log, tmp_path)
    assert code == 1
    found = {f["kind"]: f for f in out["findings"]}
    if how == "replaced":
        assert set(found) == {"untrained_params"}
        assert found["untrained_params"]["params"] == ["head.weight", "head.bias"]
        assert "replaced after opt was built" in found["untrained_params"]["message"]
    else:
        assert set(found) == {"untrained_params", "idle_optimizer"}
        assert found["idle_optimizer"]["optimizer"] == "opt"  # the script's variable
        assert found["idle_optimizer"]["steps"] == 12
    text = _run(["check", str(log)], tmp_path)
    assert text.returncode == 1 and "untrained_params on (no optimizer), from step 0" in text.stdout
