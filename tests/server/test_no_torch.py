"""The server imports and serves without torch installed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CODE = """
import sys
sys.modules["torch"] = None  # any 'import torch' now raises ImportError
import gradwatch.server.app, gradwatch.server.cli, gradwatch.replay, gradwatch.frames
assert gradwatch.replay.Streamer  # replay needs only the streamer
from fastapi.testclient import TestClient
from gradwatch.server import Settings, create_app
with TestClient(create_app(Settings(data_dir=__import__("pathlib").Path(sys.argv[1])))) as c:
    assert c.get("/healthz").json()["status"] == "ok"
    assert c.get("/api/runs").json() == {"runs": []}
assert "torch" not in [m for m in sys.modules if sys.modules[m] is not None]
print("ok")
"""


def test_server_imports_and_serves_without_torch(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-c", CODE, str(tmp_path)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
