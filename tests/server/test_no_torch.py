"""The server imports and serves the API and the dashboard without torch, and without
the ``plotly`` Python package: plotly.js is vendored in web/vendor/; on SQLite, without
psycopg (the ``[postgres]`` extra) too."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CODE = """
import hashlib, json, sys
sys.modules["torch"] = None  # any 'import torch' now raises ImportError
sys.modules["plotly"] = None
sys.modules["psycopg"] = None  # SQLite needs no PostgreSQL driver
import gradwatch.server.app, gradwatch.server.cli, gradwatch.replay, gradwatch.frames
assert gradwatch.replay.Streamer  # replay needs only the streamer
from fastapi.testclient import TestClient
from gradwatch.server import Settings, create_app
out = {}
with TestClient(create_app(Settings(data_dir=__import__("pathlib").Path(sys.argv[1]),
                                    allowed_hosts=("testserver",)))) as c:
    assert c.get("/healthz").json()["status"] == "ok"
    assert c.get("/api/runs").json() == {"runs": []}
    for path in ("/", "/static/js/main.js", "/static/vendor/plotly.min.js"):
        r = c.get(path)
        out[path] = [r.status_code, r.headers["content-type"],
                     r.headers.get("cache-control"), hashlib.sha256(r.content).hexdigest()]
assert "torch" not in [m for m in sys.modules if sys.modules[m] is not None]
print(json.dumps(out))
"""


def test_server_imports_and_serves_without_torch(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-c", CODE, str(tmp_path)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["/"][:2] == [200, "text/html; charset=utf-8"]
    assert got["/static/js/main.js"][0] == 200
    status, ctype, cache, digest = got["/static/vendor/plotly.min.js"]
    assert (status, ctype, cache) == (200, "text/javascript; charset=utf-8",
                                      "public, max-age=86400")
    vendored = (ROOT / "web" / "vendor" / "plotly.min.js").read_bytes()
    assert digest == hashlib.sha256(vendored).hexdigest()
