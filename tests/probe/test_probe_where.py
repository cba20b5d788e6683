"""Every finding names the lines of the user's code involved (``where``): real scripts under
``gradwatch run`` and under ``watch()``, a framework that calls on the user's behalf, and the
real Accelerate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

import gradwatch
from gradwatch.steplog import read_log
from gradwatch.verdict import verdict_of
from gradwatch.wire import Site, Step
from tests.probe.probe_helpers import loss_of, mlp

# Each bug in a function of its own, on its own optimizer; ``# kind:role`` marks the lines a
# finding of that kind must name. Both ways to call each of backward (``loss.backward()``,
# ``torch.autograd.backward(loss)``) and reset (the optimizer's, the module's) are named.
BUGS = textwrap.dedent('''
    import os
    import torch
    import gradwatch

    def model(seed):
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))

    def loss_of(m, i):
        g = torch.Generator().manual_seed(i)
        return m(torch.randn(8, 4, generator=g)).pow(2).mean()

    def late(m, opt):
        for i in range(3):
            loss_of(m, i).backward()  # late_reset:backward
            opt.zero_grad()  # late_reset:reset
            opt.step()  # late_reset:step

    def missed(m, opt):
        for epoch in range(2):
            opt.zero_grad()  # missed_reset:reset
            for i in range(3):
                loss = loss_of(m, i)
                torch.autograd.backward(loss)  # missed_reset:backward
                opt.step()  # missed_reset:step

    def discarded(m, opt):
        for i in range(8):
            m.zero_grad()  # discarded_accumulation:reset
            (loss_of(m, i) / 4).backward()
            if (i + 1) % 4 == 0:
                opt.step()

    def leaky(G, D, og, od):
        bce = torch.nn.functional.binary_cross_entropy_with_logits
        for i in range(4):
            g = torch.Generator().manual_seed(i)
            real, z = torch.randn(8, 2, generator=g), torch.randn(8, 4, generator=g)
            fake = G(z)
            d_loss = bce(D(real), torch.ones(8, 2)) + bce(D(fake.detach()), torch.zeros(8, 2))
            d_loss.backward()
            od.step()  # cross_optimizer_leak:step
            od.zero_grad()
            G.zero_grad()
            bce(D(fake), torch.ones(8, 2)).backward()  # cross_optimizer_leak:backward
            og.step()

    ms = [model(s) for s in range(3)]
    G, D = model(3), torch.nn.Sequential(torch.nn.Linear(2, 2))
    opts = [torch.optim.SGD(m.parameters(), lr=0.01) for m in [*ms, G, D]]

    def train():
        late(ms[0], opts[0])
        missed(ms[1], opts[1])
        discarded(ms[2], opts[2])
        leaky(G, D, opts[3], opts[4])

    if os.environ.get("GW_WATCH"):
        with gradwatch.watch(opts, log=os.environ["GW_WATCH"]):
            train()
    else:
        train()
''')


def _marks(path: Path) -> dict[str, list[tuple[str, int]]]:
    """``kind -> [(role, line)]`` from the ``# kind:role`` marks of a script."""
    out: dict[str, list[tuple[str, int]]] = {}
    for n, text in enumerate(path.read_text().splitlines(), 1):
        if "  # " in text and ":" in text.rsplit("  # ", 1)[1]:
            kind, role = text.rsplit("  # ", 1)[1].split(":")
            out.setdefault(kind, []).append((role, n))
    return out


def _gradwatch(*args: str, cwd: Path, env: dict[str, str] | None = None
               ) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **(env or {})}
    full.pop("GRADWATCH_SERVER", None)
    return subprocess.run([sys.executable, "-m", "gradwatch.cli", *args], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=180)


def _check_json(log: Path, cwd: Path) -> dict[str, Any]:
    r = _gradwatch("check", "--json", str(log), cwd=cwd)
    assert r.returncode == 1, r.stderr
    return {f["kind"]: f for f in json.loads(r.stdout)["findings"]}


@pytest.mark.parametrize("mode", ["run", "watch"])
def test_each_kind_names_its_lines(tmp_path: Path, mode: str) -> None:
    script = tmp_path / "bugs.py"
    script.write_text(BUGS)
    log = tmp_path / "bugs.jsonl"
    if mode == "run":
        r = _gradwatch("run", "--log", str(log), "--", str(script), cwd=tmp_path)
    else:
        full = {**os.environ, "GW_WATCH": str(log)}
        r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=full,
                           capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    found = _check_json(log, tmp_path)
    marks = _marks(script)
    assert sorted(found) == sorted(marks)
    functions = {"late_reset": "late", "missed_reset": "missed",
                 "discarded_accumulation": "discarded", "cross_optimizer_leak": "leaky"}
    for kind, f in found.items():
        want = marks[kind]
        if kind in ("late_reset", "missed_reset"):
            # the reset first (late: between backward and step; missed: once per epoch),
            # then the backward and the step
            want = sorted(want, key=lambda m: ["reset", "backward", "step"].index(m[0]))
        elif kind == "cross_optimizer_leak":
            want = sorted(want, key=lambda m: ["backward", "step"].index(m[0]))
        assert [(w["role"], w["line"]) for w in f["where"]] == want, (kind, f["where"])
        assert all(w["file"] == str(script) and w["function"] == functions[kind]
                   for w in f["where"])
    sites = [r for r in read_log(log).records if isinstance(r, Site)]
    # a call line is sent once, however many times it runs
    assert len({(s.file, s.line) for s in sites}) == len(sites)


FRAMEWORK = textwrap.dedent('''
    """A framework that drives the loop, and a helper the user calls (like Lightning's
    Trainer.fit and LightningModule.manual_backward)."""

    def fit(module, opt, steps):
        for i in range(steps):
            loss = module.training_step(i)
            loss.backward()  # framework:backward
            module.on_before_optimizer_step(opt)
            opt.step()  # framework:step
            opt.zero_grad()

    def manual_backward(loss):
        loss.backward()
''')

USER = textwrap.dedent('''
    import torch
    from lightning import loop

    class Module(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 2)

        def training_step(self, i):
            g = torch.Generator().manual_seed(i)
            return self.lin(torch.randn(8, 4, generator=g)).pow(2).mean()

        def on_before_optimizer_step(self, opt):
            opt.zero_grad()  # user:reset

    torch.manual_seed(0)
    module = Module()
    late_opt = torch.optim.SGD(module.parameters(), lr=0.01)
    loop.fit(module, late_opt, 3)  # user:fit

    other = Module()
    missed_opt = torch.optim.Adam(other.parameters(), lr=0.01)
    for i in range(3):
        loop.manual_backward(other.training_step(i))  # user:backward
        missed_opt.step()  # user:step
''')


def test_framework_frames(tmp_path: Path) -> None:
    """Lines inside a package named like a framework are skipped for the user's own; where
    the framework made the call itself (its loop), the user's line that started the loop is
    named, never the framework's (a callback names the user's hook instead: see
    tests/integrations)."""
    pkg = tmp_path / "fw" / "lightning"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "loop.py").write_text(FRAMEWORK)
    script = tmp_path / "train.py"
    script.write_text(USER)
    log = tmp_path / "fw.jsonl"
    r = _gradwatch("run", "--log", str(log), "--", str(script), cwd=tmp_path,
                   env={"PYTHONPATH": str(tmp_path / "fw")})
    assert r.returncode == 0, r.stderr
    found = _check_json(log, tmp_path)
    fw, user = _marks(pkg / "loop.py")["framework"], dict(_marks(script)["user"])
    late = [(w["role"], Path(w["file"]).name, w["line"]) for w in found["late_reset"]["where"]]
    assert fw  # the framework's own lines are never named
    assert late == [("reset", "train.py", user["reset"]),
                    ("backward", "train.py", user["fit"]),
                    ("step", "train.py", user["fit"])]
    missed = [(w["role"], Path(w["file"]).name, w["line"], w["function"])
              for w in found["missed_reset"]["where"]]
    assert missed == [("backward", "train.py", user["backward"], "<module>"),
                      ("step", "train.py", user["step"], "<module>")]


def test_accelerate_helpers_count_as_the_users_call(tmp_path: Path) -> None:
    """``accelerator.backward(loss)`` and the prepared optimizer's ``step``: the user's
    lines, not Accelerate's."""
    accelerate = pytest.importorskip("accelerate")
    acc = accelerate.Accelerator(cpu=True)
    m = mlp()
    model, opt = acc.prepare(m, torch.optim.SGD(m.parameters(), lr=0.01))
    path = tmp_path / "acc.jsonl"
    lines: dict[str, int] = {}
    with gradwatch.watch(opt, log=path):
        for i in range(3):
            lines["backward"] = sys._getframe().f_lineno + 1
            acc.backward(loss_of(model, i))
            lines["step"] = sys._getframe().f_lineno + 1
            opt.step()  # zero_grad forgotten
    log = read_log(path)
    (f,) = verdict_of([log.header, *log.records]).findings()
    assert f.kind == "missed_reset"
    assert [(w.role, w.line, Path(w.file).name) for w in f.where] == [
        ("backward", lines["backward"], "test_probe_where.py"),
        ("step", lines["step"], "test_probe_where.py")]


def test_clean_steps_carry_no_sites(watched: Any) -> None:
    """Steps without a finding fact name no step line (the step's site is looked up only
    when it carries one); resets name where they were called."""
    m = mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)

    def loop() -> None:
        for i in range(4):
            opt.zero_grad()
            loss_of(m, i).backward()
            opt.step()

    r = watched(opt, loop)
    steps = [s for s in r.records if isinstance(s, Step)]
    assert all(s.sites is None for s in steps)
    sites = {s.id: s for s in r.records if isinstance(s, Site)}
    reset_sites = {x.site for s in steps[1:] for x in s.resets}
    assert len(reset_sites) == 1 and sites[reset_sites.pop()].function.endswith("loop")
