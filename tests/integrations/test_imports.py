"""Each integration names what it is missing in one sentence: the callbacks without their
framework, ``pytest --gradwatch`` without torch; the pytest plugin itself loads (idle)
without torch, as it does in every pytest run of an environment that has gradwatch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.core.test_dependencies import run_without


@pytest.mark.parametrize(("module", "blocked", "missing", "sentence"), [
    ("gradwatch.lightning", {"lightning", "pytorch_lightning"}, "lightning",
     "gradwatch.lightning needs Lightning (the lightning or pytorch_lightning package), which "
     "is not installed in this environment: pip install lightning"),
    ("gradwatch.huggingface", {"transformers"}, "transformers",
     "gradwatch.huggingface needs transformers, which is not installed in this environment: "
     "pip install transformers"),
    ("gradwatch.huggingface", {"torch", "transformers"}, "torch",
     "gradwatch.huggingface needs torch, which is not installed in this environment: install "
     "PyTorch where you train (pip install torch)"),
])
def test_a_callback_without_its_framework_raises_one_sentence(
        module: str, blocked: set[str], missing: str, sentence: str) -> None:
    r = run_without(blocked, f"""
        try:
            import {module}
        except ImportError as e:
            print(type(e).__name__, e.name, str(e), sep="|")
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().split("|") == ["MissingPackageError", missing, sentence]


def test_pytorch_lightning_alone_is_enough(tmp_path: Path) -> None:
    r = run_without({"lightning"}, """
        import pytorch_lightning, gradwatch.lightning
        assert issubclass(gradwatch.lightning.GradwatchCallback, pytorch_lightning.Callback)
        assert "lightning" not in sys.modules
    """)
    if "No module named 'pytorch_lightning'" in r.stderr:
        pytest.skip("pytorch_lightning is not installed")
    assert r.returncode == 0, r.stderr


def test_pytest_gradwatch_without_torch_says_to_install_it(tmp_path: Path) -> None:
    (tmp_path / "test_x.py").write_text("def test_x():\n    pass\n")
    args = ["-p", "no:cacheprovider", str(tmp_path)]
    r = run_without({"torch"}, f"""
        import pytest
        code = pytest.main({[*args, "--gradwatch"]!r})
        assert "torch" not in sys.modules
        raise SystemExit(int(code))
    """)
    assert r.returncode == 4  # pytest's usage error
    assert ("pytest --gradwatch needs torch, which is not installed in this environment: "
            "install PyTorch where you train (pip install torch)") in r.stderr
    idle = run_without({"torch"}, f"""
        import pytest
        raise SystemExit(int(pytest.main({args!r})))
    """)
    assert idle.returncode == 0, idle.stdout + idle.stderr  # loaded, idle, no torch needed
    assert "--gradwatch " in subprocess.run(
        [sys.executable, "-m", "pytest", "--help"], capture_output=True, text=True,
        timeout=120).stdout


def test_a_wrong_server_url_is_a_usage_error() -> None:
    r = subprocess.run([sys.executable, "-m", "pytest", "--gradwatch", "--gradwatch-server",
                        "localhost:8765", "-p", "no:cacheprovider", "--co", "-q", __file__],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 4
    assert "--gradwatch-server: server= must be a URL starting with ws://" in r.stderr
