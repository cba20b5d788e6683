"""The server's transport on a real uvicorn process: the Host rule, header deadlines and
limits, tokens kept out of logs, private data files, and the README's curl upload."""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import stat
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import synth
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.serverproc import ServerProc


def raw(port: int, request: bytes, timeout: float = 10.0, upto: bytes | None = None) -> bytes:
    """Send raw bytes; read until the server closes, or until ``upto`` has arrived."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(request)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
            if upto is not None and upto in out:
                break
        return out


def ws_handshake(host: str, path: str = "/ws/live") -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    return (f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            f"Sec-WebSocket-Version: 13\r\n\r\n").encode()


def test_a_foreign_host_name_gets_403_on_http_and_websockets(tmp_path: Path) -> None:
    with ServerProc(tmp_path / "data", None, "--allow-host", "gw.lan") as srv:
        evil = f"evil.example:{srv.port}"
        r = raw(srv.port, f"GET /api/runs HTTP/1.1\r\nHost: {evil}\r\n"
                          f"Connection: close\r\n\r\n".encode())
        head, _, body = r.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 403")
        assert "--allow-host" in json.loads(body)["detail"]
        for path in ("/ws/live", "/ws/ingest"):
            r = raw(srv.port, ws_handshake(evil, path))
            assert r.startswith(b"HTTP/1.1 403"), r[:200]
            assert b"DNS rebinding" in r
        for ok in (f"127.0.0.1:{srv.port}", f"localhost:{srv.port}", f"gw.lan:{srv.port}"):
            assert raw(srv.port, ws_handshake(ok), upto=b"\r\n\r\n").startswith(
                b"HTTP/1.1 101"), ok


def test_slow_or_huge_request_heads_are_cut_off(tmp_path: Path) -> None:
    with ServerProc(tmp_path / "data", None, "--header-timeout", "1",
                    "--max-header-bytes", "8192") as srv:
        silent = raw(srv.port, b"")  # connects, sends nothing
        trickle = raw(srv.port, b"GET /api/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nX-a: b")
        assert silent.startswith(b"HTTP/1.1 408") and trickle.startswith(b"HTTP/1.1 408")
        big = raw(srv.port, b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * 20000
                  + b"\r\n\r\n")
        assert big.startswith(b"HTTP/1.1 431")
        assert srv.get("/healthz")["status"] == "ok"  # ordinary requests still go through


def test_the_token_never_lands_in_the_server_log(tmp_path: Path) -> None:
    token = "t0ken-that-must-not-leak"
    with ServerProc(tmp_path / "data", None, "--token", token, "--log-level", "info",
                    "--access-log") as srv:
        with urllib.request.urlopen(f"{srv.http}/api/runs?token={token}", timeout=10) as r:
            assert json.loads(r.read()) == {"runs": []}
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"{srv.http}/api/runs?x=1&token=wrong-{token}", timeout=10)
        r2 = raw(srv.port, ws_handshake(f"127.0.0.1:{srv.port}", f"/ws/live?token={token}"),
                 upto=b"\r\n\r\n")
        assert r2.startswith(b"HTTP/1.1 101")
        time.sleep(0.3)
    log = srv.log.read_text()
    assert "GET /api/runs?token=*** HTTP/1.1" in log and "x=1&token=***" in log
    assert "/ws/live?token=***" in log
    assert token not in log


def test_data_files_are_readable_by_their_owner_only(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with ServerProc(data) as srv:
        text = synth.log_text(synth.records(steps=5))
        req = urllib.request.Request(f"{srv.http}/api/runs/import", data=text.encode(),
                                     headers={"Content-Type": "application/x-ndjson"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 201
        assert stat.S_IMODE(data.stat().st_mode) == 0o700
        files = [p for p in data.iterdir() if p.is_file()]
        assert {p.name for p in files} >= {"gradwatch.db", "gradwatch.db-wal"}
        for p in files:
            assert stat.S_IMODE(p.stat().st_mode) == 0o600, p


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl")
def test_the_readme_curl_upload_works_and_a_form_post_needs_the_header(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    log.write_text(synth.log_text(synth.records(steps=7)))
    with ServerProc(tmp_path / "data") as srv:
        url = f"{srv.http}/api/runs/import"
        readme = ["curl", "-s", "--data-binary", f"@{log}", "-H",
                  "Content-Type: application/x-ndjson", url]
        out = json.loads(subprocess.run(readme, capture_output=True, check=True).stdout)
        assert out["steps"] == 7
        form = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-F",
                f"file=@{log}", url]
        assert subprocess.run(form, capture_output=True).stdout == b"403"
        marked = subprocess.run([*form[:-1], "-H", "X-Gradwatch: 1", url],
                                capture_output=True).stdout
        assert marked == b"201"


def test_a_hostile_number_closes_1007_on_a_real_server_without_a_traceback(
        tmp_path: Path) -> None:
    recs = synth.records(steps=3)
    frame = synth.batches(recs, size=100)[0].replace('"step":1,', f'"step":{2**64},', 1)
    with ServerProc(tmp_path / "data") as srv:
        with connect(srv.ws + "/ws/ingest", open_timeout=5) as ws:
            ws.send(frame)
            with pytest.raises(ConnectionClosed) as e:
                ws.recv(timeout=10)
        assert e.value.rcvd is not None and e.value.rcvd.code == 1007
        assert "field 'step' of record 3 ('step')" in e.value.rcvd.reason
        assert srv.get("/api/runs") == {"runs": []}
    assert "Traceback" not in srv.log.read_text()
