"""Dependencies point one way: the probe and the CLI run without the server's packages,
and the torch-free core (wire, verdict, check) runs without torch. Where a part's packages
are missing, it says so in one sentence (the CLI: one line and exit 2, no traceback).

Packages are made unimportable in a subprocess, as if not installed; tests/packaging
installs the real thing into fresh virtual environments."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SERVER = {"fastapi", "starlette", "uvicorn"}
BLOCK = textwrap.dedent("""
    import sys
    class _Block:
        def find_spec(self, name, path=None, target=None):
            top = name.split(".")[0]
            if top in {blocked!r}:  # what a missing package raises
                raise ModuleNotFoundError(f"No module named {{top!r}}", name=top)
    sys.meta_path.insert(0, _Block())
""")


def run_without(blocked: set[str], body: str) -> subprocess.CompletedProcess[str]:
    code = BLOCK.format(blocked=blocked) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)


def test_probe_watches_a_training_loop_without_fastapi(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    r = run_without(SERVER, f"""
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


def cli_without(blocked: set[str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``gradwatch ARGS`` with ``blocked`` unimportable."""
    return run_without(blocked, f"""
        from gradwatch.cli import main
        raise SystemExit(main({list(args)!r}))
    """)


def test_gradwatch_imports_without_torch_and_watch_says_to_install_it() -> None:
    r = run_without({"torch"}, """
        import gradwatch, gradwatch.check, gradwatch.wire
        errors = []
        for attempt in ("gradwatch.watch", "__import__('gradwatch.probe.api')",
                        "__import__('gradwatch.probe.runner')"):
            try:
                eval(attempt)
            except ImportError as e:
                errors.append((type(e).__name__, e.name, str(e)))
            else:
                raise SystemExit(f"{attempt} did not raise")
        try:
            from gradwatch import watch  # noqa: F401
        except ImportError as e:
            errors.append((type(e).__name__, e.name, str(e)))
        assert "torch" not in sys.modules
        print(repr(errors))
    """)
    assert r.returncode == 0, r.stderr
    errors = eval(r.stdout)
    assert len(errors) == 4
    for cls, name, message in errors:
        assert cls == "TorchMissingError" and name == "torch"
        assert message == ("the gradwatch probe (gradwatch.watch) needs torch, which is not "
                           "installed in this environment: install PyTorch where you train "
                           "(pip install torch)")


@pytest.mark.parametrize("command", [["serve", "--port", "0"], ["demo", "--once"]])
def test_server_commands_without_the_server_extra_print_the_install_line(
        command: list[str]) -> None:
    r = cli_without(SERVER, *command)
    assert r.returncode == 2
    assert r.stdout == ""
    assert r.stderr == (f"gradwatch {command[0]} needs the server extra (fastapi, uvicorn), "
                        "which is not installed in this environment: "
                        "pip install fastapi 'uvicorn[standard]'\n")


def test_run_and_demo_without_torch_say_to_install_it(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('the script must not run')\n")
    r = cli_without({"torch"}, "run", "--", str(script))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == [
        "gradwatch run needs torch, which is not installed in this environment: "
        "install PyTorch where you train (pip install torch)"]
    r = cli_without({"torch"} | SERVER, "demo")
    assert r.returncode == 2
    assert [line.split(" needs ")[1].split(",")[0] for line in r.stderr.splitlines()] == [
        "the server extra (fastapi", "torch"]


def test_a_broken_install_is_one_line_too(tmp_path: Path) -> None:
    # pydantic is a base dependency: without it even `check` cannot load.
    r = cli_without({"pydantic"}, "check", str(tmp_path / "run.jsonl"))
    assert r.returncode == 2
    assert r.stderr == ("gradwatch check: cannot load gradwatch.check: "
                        "No module named 'pydantic'\n")


ROOT = Path(__file__).resolve().parents[2]
PUBLIC_NAMES = {"lightning.py", "huggingface.py"}
"""Core modules that only re-export an integration under its documented import path."""


def _imports_at_load(path: Path) -> set[str]:
    """Modules ``path`` imports when it is loaded (not inside functions or TYPE_CHECKING)."""
    import ast

    found: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def test_the_core_never_loads_the_layers_above_it() -> None:
    """gradwatch/ is the torch-free core: loading a module of it loads neither the probe nor
    the integrations (the two public callback names excepted, which are only re-exports)."""
    above = ("gradwatch.probe", "gradwatch.integrations")
    for path in sorted((ROOT / "gradwatch").glob("*.py")):
        loaded = {m for m in _imports_at_load(path) if m.startswith(above)}
        if path.name in PUBLIC_NAMES:
            assert loaded == {f"gradwatch.integrations.{path.stem}"}, path.name
        else:
            assert not loaded, (path.name, loaded)
