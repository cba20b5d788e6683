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


GAN = textwrap.dedent('''
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
''')
"""A GAN whose discriminator steps on gradients the generator's loss left in it."""


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
    assert "missed_reset on opt, from step 1 (4 steps)" in r.stderr
    c = _run(["check", "--json", str(log)], tmp_path)
    assert c.returncode == 1
    out = json.loads(c.stdout)
    assert [(f["kind"], f["optimizer"], f["first_step"], f["steps"]) for f in out["findings"]] \
        == [("missed_reset", "opt", 1, 4)]
    assert read_log(log).records[0].opt == "SGD#0"  # the id in the records stays
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
    # the script's own traceback: its frames only, none of the runner's or runpy's
    tb = r.stderr[r.stderr.index("Traceback"):].splitlines()
    assert tb[1] == f'  File "{script}", line 23, in <module>'
    assert "runpy" not in r.stderr and "runner.py" not in r.stderr
    assert ("gradwatch: the script raised (RuntimeError: boom) after 5 optimizer steps; in "
            "those steps, no finding") in r.stderr
    assert "no gradient-reset bug found" not in r.stderr
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
        while open({str(log)!r}).read().count('"type":"step"') < 4:
            time.sleep(0.05)  # the writer flushes at least every second
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
    """Manual SGD (no optimizer) stays clean, its updates counted as steps; a GAN script gets
    names and the leak found."""
    from gradwatch.probe import runner
    from gradwatch.verdict import verdict_of

    monkeypatch.chdir(tmp_path)
    manual = tmp_path / "manual.py"
    manual.write_text(textwrap.dedent('''
        import torch
        w = torch.zeros(3, requires_grad=True)
        for i in range(8):
            loss = ((w - 1.0) ** 2).sum()
            loss.backward()
            with torch.no_grad():
                w -= 0.1 * w.grad
            w.grad.zero_()
    '''))
    assert runner.main(["--log", "manual.jsonl", "--", str(manual)]) == 0
    err = capsys.readouterr().err
    assert "no gradient-reset bug found" in err and "0 optimizer steps" not in err
    steps = [r for r in read_log(tmp_path / "manual.jsonl").records if isinstance(r, Step)]
    assert {s.opt for s in steps} == {"manual"} and len(steps) >= 4
    gan = tmp_path / "gan.py"
    gan.write_text(GAN)
    assert runner.main(["--log", "gan.jsonl", "--", str(gan)]) == 0
    err = capsys.readouterr().err
    assert "cross_optimizer_leak on od, from step" in err
    log = read_log(tmp_path / "gan.jsonl")
    infos = [r for r in log.records if r.type == "optimizer"]
    assert [(i.opt, i.label) for i in infos] == [("Adam#0", "og"), ("Adam#1", "od")]
    assert infos[0].params == ["G.net.weight", "G.net.bias"]
    assert infos[1].params == ["D.0.weight", "D.0.bias"]
    kinds = {(f.kind, f.optimizer) for f in verdict_of([log.header, *log.records]).findings()}
    assert kinds == {("cross_optimizer_leak", "od")}


# ------------------------------------------------------------------ what happened, said so
def test_a_script_that_fails_before_any_step_is_not_called_clean(tmp_path: Path) -> None:
    prog = tmp_path / "early.py"
    prog.write_text("import torch\nraise ValueError('no data')\n")
    log = tmp_path / "early.jsonl"
    r = _run(["run", "--log", str(log), "--", str(prog)], tmp_path)
    assert r.returncode == 1
    assert ("gradwatch: the script raised (ValueError: no data) before any optimizer step: "
            "nothing was judged") in r.stderr
    assert "no gradient-reset bug found" not in r.stderr
    c = _run(["check", str(log)], tmp_path)
    assert c.returncode == 3
    assert "the run failed before its first optimizer step (exit code 1)" in c.stderr


@pytest.mark.parametrize(("target", "said"), [
    (["-m", "no_such_module_here"], "could not be loaded (ImportError: No module named"),
    (["broken.py"], "could not be loaded (SyntaxError:"),
    (["idle.py"], "no optimizer stepped in this process, so nothing was judged"),
])
def test_scripts_that_never_step_say_what_happened(tmp_path: Path, target: list[str],
                                                   said: str) -> None:
    (tmp_path / "broken.py").write_text("x = (\n")
    (tmp_path / "idle.py").write_text("print('hello')\n")
    log = tmp_path / "x.jsonl"
    r = _run(["run", "--log", str(log), "--", *target], tmp_path)
    assert said in r.stderr, r.stderr
    assert "no gradient-reset bug found" not in r.stderr
    assert r.returncode == (0 if target == ["idle.py"] else 1)
    assert "runpy" not in r.stderr
    assert _run(["check", str(log)], tmp_path).returncode == 3


def _run_here(args: list[str], cwd: Path, monkeypatch: pytest.MonkeyPatch,
              capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``gradwatch <args>`` in this process (the command's own ``main``, which the console
    script exits with): the exit code and stderr. For tests of what ``run`` decides; each
    torch process started costs seconds of torch's and torch._dynamo's imports, and the
    subprocess tests above already hold the process's exit code to ``main``'s."""
    from gradwatch.cli import main

    monkeypatch.chdir(cwd)
    monkeypatch.delenv("GRADWATCH_SERVER", raising=False)
    monkeypatch.delenv("GRADWATCH_LOG", raising=False)
    capsys.readouterr()
    rc = main(args)
    return rc, capsys.readouterr().err


def test_fail_on_findings_fails_a_successful_script_with_findings(
        script: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    log = str(tmp_path / "gate.jsonl")
    rc, err = _run_here(["run", "--fail-on-findings", "--log", log, "--", str(script),
                         "--bug"], tmp_path, monkeypatch, capsys)
    assert rc == 1 and "1 finding" in err
    rc, _ = _run_here(["run", "--fail-on-findings", "--log", log, "--", str(script)],
                      tmp_path, monkeypatch, capsys)
    assert rc == 0
    # the script's own failure stays the rule
    rc, _ = _run_here(["run", "--fail-on-findings", "--log", log, "--", str(script), "--bug",
                       "--exit3"], tmp_path, monkeypatch, capsys)
    assert rc == 3
    # without the flag, findings leave the exit status alone: the next test's first run


def test_running_again_with_the_same_log_replaces_it(
        script: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "again.jsonl"
    rc, err = _run_here(["run", "--log", str(log), "--", str(script), "--bug"], tmp_path,
                        monkeypatch, capsys)
    assert rc == 0 and "1 finding" in err  # no --fail-on-findings
    assert "replaced" not in err
    _, err = _run_here(["run", "--log", str(log), "--", str(script)], tmp_path, monkeypatch,
                       capsys)
    assert f"writing the step log to {log} (replaced the step log of an earlier run)" in err
    assert len([r for r in read_log(log).records if isinstance(r, Step)]) == 5
    c = _run(["check", str(log)], tmp_path)
    assert c.returncode == 0, c.stdout + c.stderr


def test_a_file_that_is_no_step_log_is_not_written_over(script: Path,
                                                        tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    r = _run(["run", "--log", str(notes), "--", str(script)], tmp_path)
    assert r.returncode == 2 and "is a file that is not a gradwatch step log" in r.stderr
    assert notes.read_text() == "my notes\n"


def test_check_sarif_of_a_real_run_points_into_the_script(
        script: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / ".git").mkdir()
    log = tmp_path / "s.jsonl"
    assert _run_here(["run", "--log", str(log), "--", "train.py", "--bug"], tmp_path,
                     monkeypatch, capsys)[0] == 0
    r = _run(["check", "--format", "sarif", str(log)], tmp_path)
    assert r.returncode == 1, r.stderr
    [res] = json.loads(r.stdout)["runs"][0]["results"]
    assert res["ruleId"] == "missed_reset"
    assert res["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "train.py"


def test_python_dash_m_gradwatch_is_the_command(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "gradwatch", "--version"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("gradwatch ")


# ------------------------------------------------------------------ launchers and workers
DDP_SCRIPT = textwrap.dedent('''
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(rank)
    for i in range(6):
        if rank == 0 or i < 2:  # rank 1 forgets zero_grad from step 2 on
            opt.zero_grad()
        ddp(torch.randn(8, 4, generator=gen)).pow(2).mean().backward()
        opt.step()
    dist.destroy_process_group()
''')


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_torchrun_inside_gradwatch_run_shows_the_launch_that_works(tmp_path: Path) -> None:
    # The ranks' own work does not matter here (only the launcher runs under the probe);
    # a script with no process group keeps gloo's teardown out of this test.
    (tmp_path / "ddp.py").write_text("import torch\nprint(torch.ones(1).item())\n")
    port = str(_free_port())
    r = _run(["run", "--log", "out.jsonl", "--", "torchrun", "--nproc_per_node", "2",
              "--master-port", port, "ddp.py"], tmp_path, timeout=240)
    assert r.returncode == 0, r.stderr
    assert "no optimizer stepped in this process, so nothing was judged" in r.stderr
    assert ("Launch gradwatch inside each of them instead: torchrun --nproc_per_node 2 "
            f"--master-port {port} -m gradwatch run --step-log out.jsonl -- ddp.py") in r.stderr
    assert "no gradient-reset bug found" not in r.stderr


HOGWILD = textwrap.dedent('''
    import sys
    import torch
    import torch.multiprocessing as mp
    from torch.utils.data import DataLoader, TensorDataset

    def train(rank, model, data):
        torch.manual_seed(rank)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for i, (x, y) in enumerate(data):
            if rank != 1 or i == 0:  # worker 2 (rank 1) forgets zero_grad after its first
                opt.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            opt.step()

    if __name__ == "__main__":
        ctx = mp.get_context(sys.argv[1])
        model = torch.nn.Linear(3, 1)
        model.share_memory()
        data = [(torch.randn(4, 3), torch.randn(4, 1)) for _ in range(5)]
        procs = [ctx.Process(target=train, args=(r, model, data)) for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        assert [p.exitcode for p in procs] == [0, 0]
        # a DataLoader's worker process builds no optimizer: it gets no log
        loader = DataLoader(TensorDataset(torch.randn(8, 3)), batch_size=4, num_workers=1,
                            multiprocessing_context=sys.argv[1])
        assert len(list(loader)) == 2
''')


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_worker_processes_the_script_starts_are_watched(tmp_path: Path, method: str) -> None:
    (tmp_path / "hog.py").write_text(HOGWILD)
    (tmp_path / "hog.worker7.jsonl").write_text('{"type":"header"}\n')  # an earlier run's
    r = _run(["run", "--log", "hog.jsonl", "--", "hog.py", method], tmp_path, timeout=240)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tmp_path.glob("hog*.jsonl")) == [
        "hog.jsonl", "hog.worker1.jsonl", "hog.worker2.jsonl"]
    assert "10 optimizer steps in 3 processes, 1 finding" in r.stderr
    assert "missed_reset on opt, from step 1 (4 steps), worker 2" in r.stderr
    logs = sorted(str(p) for p in tmp_path.glob("hog*.jsonl"))
    heads = [read_log(p).header for p in logs]
    assert len({h.run for h in heads}) == 1 and [h.worker for h in heads] == [None, 1, 2]
    c = _run(["check", "--json", *logs], tmp_path)
    assert c.returncode == 1
    assert [(f["kind"], f["worker"]) for f in json.loads(c.stdout)["findings"]] == [
        ("missed_reset", 2)]


def test_a_pipe_log_a_folder_script_or_a_gz_log_to_stream_is_refused_before_it_runs(
        script: Path, tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.jsonl")  # the first write would wait for a reader forever
    r = _run(["run", "--log", "pipe.jsonl", "--", str(script)], tmp_path)
    assert r.returncode == 2 and "named pipe" in r.stderr and "trained" not in r.stdout
    (tmp_path / "pkg").mkdir()
    r = _run(["run", "--", "pkg"], tmp_path)  # was "script not found"
    assert r.returncode == 2 and "pkg is a folder" in r.stderr, r.stderr
    # --server with a .gz log: refused as watch() refuses it (it streamed nothing, said late)
    r = _run(["run", "--log", "run.jsonl.gz", "--server", "ws://127.0.0.1:9", "--",
              str(script)], tmp_path)
    assert r.returncode == 2 and "must be plain" in r.stderr and "trained" not in r.stdout


def test_an_unwritable_log_is_refused_before_the_script_runs(script: Path,
                                                             tmp_path: Path) -> None:
    r = _run(["run", "--log", "/proc/gradwatch-nope/run.jsonl", "--", str(script)], tmp_path)
    assert r.returncode == 2 and "cannot write there" in r.stderr
    assert "trained" not in r.stdout


def test_a_session_that_cannot_open_leaves_training_alone(tmp_path: Path,
                                                          caplog: pytest.LogCaptureFixture
                                                          ) -> None:
    import torch

    from gradwatch.probe.autostart import AutoSession, Plan

    blocker = tmp_path / "file"
    blocker.write_text("")
    session = AutoSession(Plan(log=str(blocker / "run.jsonl"), run_name="x", run="x"))
    orig = torch.optim.Optimizer.__init__
    session.install()
    try:
        m = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)  # opening the log fails here
        m(torch.randn(3, 2)).sum().backward()
        opt.step()
    finally:
        session.close("finished", 0)
    assert session.failed and "cannot watch this run" in caplog.text
    assert torch.optim.Optimizer.__init__ is orig  # put back


def test_compiled_training_step_under_run(tmp_path: Path) -> None:
    """The session opens inside a compiled step (its first backward): still every step."""
    prog = tmp_path / "compiled.py"
    prog.write_text(textwrap.dedent('''
        import torch
        model = torch.nn.Linear(4, 1)

        @torch.compile(backend="eager")
        def grads(x):
            model(x).pow(2).mean().backward()

        grads(torch.randn(8, 4))  # the first backward, compiled, opens the session
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for i in range(4):
            grads(torch.randn(8, 4))  # zero_grad forgotten
            opt.step()
    '''))
    r = _run(["run", "--log", "c.jsonl", "--", str(prog)], tmp_path, timeout=240)
    assert r.returncode == 0, r.stderr
    assert "4 optimizer steps, 1 finding" in r.stderr
    assert "missed_reset on opt, from step 1 (3 steps)" in r.stderr
