"""Imports that would inflate past any memory, on a real server: a gzip of a gigabyte of
newlines, a gzip of one endless line, a plain endless line. Each is refused with 413 and a
sentence, and the server keeps answering meanwhile."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
import zlib
from pathlib import Path

import pytest
import synth

from tests.serverproc import ServerProc

NDJSON = {"Content-Type": "application/x-ndjson"}


def _gzip_of(piece: bytes, times: int) -> bytes:
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    return b"".join([*(z.compress(piece) for _ in range(times)), z.flush()])


def _post(url: str, body: bytes) -> tuple[int, str]:
    req = urllib.request.Request(url, data=body, headers=NDJSON)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.fixture(scope="module")
def newline_bomb() -> bytes:
    """A gzip of 1 GiB of newlines, about a megabyte."""
    return _gzip_of(b"\n" * (1 << 20), 1024)


def test_a_gzip_of_a_gigabyte_of_newlines_is_refused_and_the_server_stays_up(
        tmp_path: Path, newline_bomb: bytes) -> None:
    assert len(newline_bomb) < 2 << 20
    with ServerProc(tmp_path / "data") as srv:
        url = f"{srv.http}/api/runs/import"
        answer: list[tuple[int, str]] = []
        t = threading.Thread(target=lambda: answer.append(_post(url, newline_bomb)))
        t.start()
        slowest = 0.0
        while t.is_alive():
            t0 = time.monotonic()
            with urllib.request.urlopen(f"{srv.http}/healthz", timeout=5) as r:
                assert json.loads(r.read())["status"] == "ok"
            slowest = max(slowest, time.monotonic() - t0)
            time.sleep(0.05)
        t.join()
        status, body = answer[0]
        assert status == 413, body
        assert "over 536870912 bytes of text (inflated)" in json.loads(body)["detail"]
        assert slowest < 1.0  # the bar: the event loop stays free meanwhile
        assert srv.get("/api/runs") == {"runs": []}


def test_one_endless_line_is_refused_compressed_or_not(tmp_path: Path) -> None:
    line = 1 << 20  # --max-line-bytes below
    recs = synth.log_text(synth.records(steps=3)).encode()
    with ServerProc(tmp_path / "data", None, "--max-line-bytes", str(line)) as srv:
        url = f"{srv.http}/api/runs/import"
        n = recs.count(b"\n") + 1  # the endless line's number
        for body in (recs + b"x" * (2 * line),  # plain
                     _gzip_of(recs + b"x" * (1 << 20), 64)):  # 64 MiB inflated
            status, text = _post(url, body)
            assert status == 413, text
            assert json.loads(text)["detail"] == (
                f"upload: line {n} is longer than {line} bytes; no step-log record is "
                f"that long")
        assert srv.get("/api/runs") == {"runs": []}
        # a log whose lines are under the limit still imports, gzip-compressed too
        status, text = _post(url, _gzip_of(recs, 1))
        assert status == 201 and json.loads(text)["steps"] == 3, text


def test_a_gzip_log_of_many_blocks_imports_whole_with_its_line_numbers(
        tmp_path: Path) -> None:
    recs = synth.records(steps=6000)
    text = synth.log_text(recs).replace("\n", "\n\n \n", 50)  # blank lines on the way
    with ServerProc(tmp_path / "data") as srv:
        url = f"{srv.http}/api/runs/import"
        status, body = _post(url, _gzip_of(text.encode(), 1))
        assert status == 201 and json.loads(body)["steps"] == 6000, body
        lines = text.split("\n")
        k = len(lines) - 100  # a step line past the first block of text
        assert '"step":' in lines[k]
        lines[k] = lines[k].replace('"step":', '"step":"x",', 1)
        status, body = _post(url, _gzip_of("\n".join(lines).encode(), 1))
        assert status == 400 and json.loads(body)["detail"].startswith(f"upload:{k + 1}: "), body
