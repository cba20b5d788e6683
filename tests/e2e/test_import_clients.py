"""Step logs written by the probe, 100 KiB to 5 MiB, imported into a real server by the
clients users have: urllib, httpx, curl (the README's line), and a raw socket writing head
and body in one ``sendall``. A request whose body arrives with its head is no big head."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import urllib.request
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.serverproc import ServerProc

torch = pytest.importorskip("torch")
import gradwatch  # noqa: E402

# One worker builds the logs once for every client (session scope: a module fixture is made
# again when the worker's order interleaves other modules between these tests).
pytestmark = pytest.mark.xdist_group("import-clients")

SIZES = {"100KiB": 100 << 10, "196KiB": 196 << 10, "1MiB": 1 << 20, "5MiB": 5 << 20}
NDJSON = "application/x-ndjson"


def _train(log: Path, steps: int) -> None:
    torch.manual_seed(0)
    # Many parameters: a step record carries two norms per parameter, so a few hundred
    # steps make megabytes.
    params = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(2)) for _ in range(2000)])
    each = list(params)  # indexing a ParameterList 2000 times a step costs more than the step
    opt = torch.optim.SGD(params, lr=0.001)
    with gradwatch.watch(opt, model=params, log=log, run_name=log.stem):
        for _ in range(steps):
            opt.zero_grad()
            torch.stack(each).pow(2).sum().backward()
            opt.step()


def _steps(text: bytes) -> int:
    return sum(json.loads(line)["type"] == "step" for line in text.splitlines())


@pytest.fixture(scope="session")
def logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, int]]:
    """Real step logs of at least each size, with their step counts: one run the probe
    wrote, and its first lines, as a run that crashed earlier leaves."""
    d = tmp_path_factory.mktemp("logs")
    whole = d / "whole.jsonl"
    _train(whole, 480)
    text = whole.read_bytes()
    assert len(text) >= max(SIZES.values())
    out = {}
    for name, size in SIZES.items():
        cut = text[:text.index(b"\n", size) + 1]
        (d / f"{name}.jsonl").write_bytes(cut)
        out[name] = (d / f"{name}.jsonl", _steps(cut))
    return out


def _urllib(url: str, body: bytes) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": NDJSON})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.status, r.read()


def _httpx(url: str, body: bytes) -> tuple[int, bytes]:
    r = httpx.post(url, content=body, headers={"Content-Type": NDJSON}, timeout=60)
    return r.status_code, r.content


def _one_write(url: str, body: bytes) -> tuple[int, bytes]:
    port = int(url.split(":")[2].split("/")[0])
    head = (f"POST /api/runs/import HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: {NDJSON}\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(head + body)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    status, _, rest = out.partition(b"\r\n\r\n")
    return int(status.split()[1]), rest


def _curl(url: str, body: bytes, path: Path) -> tuple[int, bytes]:
    r = subprocess.run(["curl", "-s", "-w", "\n%{http_code}", "--data-binary", f"@{path}",
                        "-H", f"Content-Type: {NDJSON}", url],
                       capture_output=True, check=True, timeout=60)
    text, _, code = r.stdout.rpartition(b"\n")
    return int(code), text


CLIENTS: dict[str, Callable[..., tuple[int, bytes]]] = {
    "urllib": _urllib, "httpx": _httpx, "one-sendall": _one_write, "curl": _curl}


@pytest.mark.parametrize("client", list(CLIENTS))
def test_real_step_logs_import_whole_whatever_the_client(
        tmp_path: Path, logs: dict[str, tuple[Path, int]], client: str) -> None:
    if client == "curl" and shutil.which("curl") is None:
        pytest.skip("no curl")
    # A small head limit makes a head counted with its body fail at once.
    with ServerProc(tmp_path / "data", None, "--max-header-bytes", "4096") as srv:
        url = f"{srv.http}/api/runs/import"
        for name, (path, steps) in logs.items():
            body = path.read_bytes()
            send = CLIENTS[client]
            status, reply = (send(url, body, path) if client == "curl" else send(url, body))
            assert status == 201, (name, status, reply[:300])
            assert json.loads(reply)["steps"] == steps, name
        assert len(srv.get("/api/runs")["runs"]) == len(logs)
