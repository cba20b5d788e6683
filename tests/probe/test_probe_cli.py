"""``gradwatch run`` and ``gradwatch check`` through the real command line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gradwatch.steplog import read_log
from gradwatch.wire import End, Step

TRAIN = textwrap.dedent('''
    import sys
    import torch

    def main(bug: bool) -> None:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),
                                    torch.nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for i in range(5):
            if not bug:
                opt.zero_grad()
            x = torch.randn(8, 4)
            model(x).pow(2).mean().backward()
            opt.step()
        print("trained", sys.argv[1:])

    if __name__ == "__main__":
        main("--bug" in sys.argv)
        if "--exit3" in sys.argv:
            sys.exit(3)
        if "--crash" in sys.argv:
            raise RuntimeError("boom")
''')


def _cli() -> list[str]:
    exe = Path(sys.executable).parent / "gradwatch"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "gradwatch.cli"]


def _run(args: list[str], cwd: Path, env: dict[str, str] | None = None,
         timeout: float = 120) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    full_env.pop("GRADWATCH_SERVER", None)
    full_env.pop("GRADWATCH_LOG", None)
    return subprocess.run(_cli() + args, cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    p = tmp_path / "train.py"
    p.write_text(TRAIN)
    return p


def test_run_script_clean_then_check(script: Path, tmp_path: Path) -> None:
    log = tmp_path / "clean.jsonl"
    r = _run(["run", "--log", str(log), "--name", "demo", "--", str(script), "a", "b"],
             tmp_path)
    assert r.returncode == 0, r.stderr
    assert "trained ['a', 'b']" in r.stdout  # sys.argv as the script expects
    assert "no gradient-reset bug found" in r.stderr
    parsed = read_log(log)
    assert parsed.header.run_name == "demo"
    steps = [x for x in parsed.records if isinstance(x, Step)]
    assert len(steps) == 5 and steps[0].opt == "SGD#0"
    info = next(x for x in parsed.records if x.type == "optimizer")
    assert info.params == ["0.weight", "0.bias", "2.weight", "2.bias"]  # found via gc
    assert isinstance(parsed.records[-1], End) and parsed.records[-1].status == "finished"
    c = _run(["check", str(log)], tmp_path)
    assert c.returncode == 0, c.stdout + c.stderr


def test_run_script_with_bug_default_log_and_check_json(script: Path, tmp_path: Path) -> None:
    r = _run(["run", "--", str(script), "--bug"], tmp_path,
             env={"GRADWATCH_RUN_ID": "bugrun"})
    assert r.returncode == 0, r.stderr
    log = tmp_path / "gradwatch-bugrun.jsonl"
    assert log.exists() and str(log.name) in r.stderr
    assert "missed_reset  SGD#0  first_step=1  steps=4" in r.stderr
    c = _run(["check", "--json", str(log)], tmp_path)
    assert c.returncode == 1
    out = json.loads(c.stdout)
    assert [(f["kind"], f["optimizer"], f["first_step"], f["steps"]) for f in out["findings"]] \
        == [("missed_reset", "SGD#0", 1, 4)]
    assert out["findings"][0]["params"] == ["0.weight", "0.bias", "2.weight", "2.bias"]


def test_run_module_exit_code_passthrough(script: Path, tmp_path: Path) -> None:
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    shutil.copy(script, pkg / "train.py")
    log = tmp_path / "m.jsonl"
    r = _run(["run", "--log", str(log), "--", "-m", "mypkg.train", "--exit3"], tmp_path)
    assert r.returncode == 3, r.stderr
    end = read_log(log).records[-1]
    assert isinstance(end, End) and end.exit_code == 3 and end.status == "failed"


def test_run_uncaught_exception_exits_1(script: Path, tmp_path: Path) -> None:
    log = tmp_path / "crash.jsonl"
    r = _run(["run", "--log", str(log), "--", str(script), "--crash"], tmp_path)
    assert r.returncode == 1
    assert "RuntimeError: boom" in r.stderr and "Traceback" in r.stderr
    end = read_log(log).records[-1]
    assert isinstance(end, End) and end.status == "failed" and end.exit_code == 1


@pytest.mark.parametrize("args", [[], ["--"], ["--", "missing.py"], ["--bogus", "--", "x.py"],
                                  ["--", "-m"]])
def test_run_bad_arguments_exit_2(args: list[str], tmp_path: Path) -> None:
    r = _run(["run", *args], tmp_path)
    assert r.returncode == 2
    assert "gradwatch run:" in r.stderr


def test_check_unreadable_log_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("this is not json\n")
    r = _run(["check", str(bad)], tmp_path)
    assert r.returncode == 2 and "bad.jsonl:1" in r.stderr


def test_crash_mid_run_leaves_complete_lines(tmp_path: Path) -> None:
    prog = tmp_path / "killed.py"
    log = tmp_path / "killed.jsonl"
    prog.write_text(textwrap.dedent(f'''
        import os, signal, time
        import torch, gradwatch
        m = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        gradwatch.watch(opt, log={str(log)!r})
        for i in range(4):
            m(torch.randn(2, 3)).sum().backward()  # zero_grad forgotten
            opt.step()
        time.sleep(1.5)  # the writer flushes at least every second
        os.kill(os.getpid(), signal.SIGKILL)
    '''))
    r = subprocess.run([sys.executable, str(prog)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0
    with log.open("a") as fh:
        fh.write('{"type": "step", "seq": 9')  # a torn last line, as a crash mid-write
    parsed = read_log(log)
    assert [s.step for s in parsed.records if isinstance(s, Step)] == [0, 1, 2, 3]
    assert parsed.warnings and "truncated" in parsed.warnings[0]
    c = _run(["check", str(log)], tmp_path)
    assert c.returncode == 1 and "missed_reset" in c.stdout


def test_run_in_process_manual_sgd_and_gan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Manual SGD (no optimizer) stays clean; a GAN script gets names and the leak found."""
    from gradwatch.probe import runner
    from gradwatch.verdict import verdict_of

    monkeypatch.chdir(tmp_path)
    manual = tmp_path / "manual.py"
    manual.write_text(textwrap.dedent('''
        import torch
        w = torch.zeros(3, requires_grad=True)
        for i in range(4):
            loss = ((w - 1.0) ** 2).sum()
            loss.backward()
            with torch.no_grad():
                w -= 0.1 * w.grad
            w.grad.zero_()
    '''))
    assert runner.main(["--log", "manual.jsonl", "--", str(manual)]) == 0
    assert "0 optimizer steps, no gradient-reset bug found" in capsys.readouterr().err
    gan = tmp_path / "gan.py"
    gan.write_text(textwrap.dedent('''
        import torch
        class Gen(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.net = torch.nn.Linear(3, 4)
            def forward(self, z):
                return self.net(z)
        G = Gen()
        D = torch.nn.Sequential(torch.nn.Linear(4, 1))
        og = torch.optim.Adam(G.parameters(), lr=1e-3)
        od = torch.optim.Adam(D.parameters(), lr=1e-3)
        for i in range(3):
            fake = G(torch.randn(5, 3))
            D(fake.detach()).mean().backward()
            od.step()
            od.zero_grad()
            og.zero_grad()
            (-D(fake)).mean().backward()  # fills D's grads: not cleared before D's step
            og.step()
    '''))
    assert runner.main(["--log", "gan.jsonl", "--", str(gan)]) == 0
    err = capsys.readouterr().err
    assert "cross_optimizer_leak  Adam#1" in err
    log = read_log(tmp_path / "gan.jsonl")
    infos = [r for r in log.records if r.type == "optimizer"]
    assert infos[0].params == ["Gen.net.weight", "Gen.net.bias"]
    assert infos[1].params == ["Sequential.0.weight", "Sequential.0.bias"]
    kinds = {(f.kind, f.optimizer) for f in verdict_of([log.header, *log.records]).findings()}
    assert kinds == {("cross_optimizer_leak", "Adam#1")}
