"""Dependencies point one way: the probe and the CLI run without the server's packages,
and the torch-free core (wire, analysis, check) runs without torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

BLOCK = textwrap.dedent("""
    import sys
    class _Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {blocked!r}:
                raise ImportError(f"blocked for this test: {{name}}")
    sys.meta_path.insert(0, _Block())
""")


def run_without(blocked: set[str], body: str) -> subprocess.CompletedProcess[str]:
    code = BLOCK.format(blocked=blocked) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)


def test_probe_watches_a_training_loop_without_fastapi(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    r = run_without({"fastapi", "starlette", "uvicorn", "plotly"}, f"""
        import torch, gradwatch
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with gradwatch.watch(opt, model=model, log={str(log)!r}):
            for _ in range(3):
                opt.zero_grad()
                model(torch.randn(8, 4)).sum().backward()
                opt.step()
        import gradwatch.probe.runner, gradwatch.check
        assert "fastapi" not in sys.modules
    """)
    assert r.returncode == 0, r.stderr
    assert log.read_text().count('"type":"step"') == 3


def test_check_runs_without_torch(tmp_path: Path) -> None:
    from tests.core.logs import missed_reset_log, write

    path = write(tmp_path / "bug.jsonl", missed_reset_log())
    r = run_without({"torch", "fastapi"}, f"""
        from gradwatch.cli import main
        rc = main(["check", {str(path)!r}])
        assert "torch" not in sys.modules
        raise SystemExit(rc)
    """)
    assert r.returncode == 1, r.stderr
    assert "missed_reset" in r.stdout


def test_replay_and_the_streamer_load_without_torch() -> None:
    r = run_without({"torch"}, """
        from gradwatch.cli import main
        import gradwatch.replay
        assert gradwatch.replay.Streamer
        assert "torch" not in sys.modules
        raise SystemExit(main(["replay", "--help"]))
    """)
    assert r.returncode == 0, r.stderr
    assert "replay" in r.stdout
