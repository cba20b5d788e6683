"""On a real server and through the CLI: names that are not text or that reorder text are
refused, run ids are safe path segments, ``check`` escapes what a terminal would act on,
and a run holds a bounded number of optimizers (each refused with a sentence)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import synth
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from gradwatch.frames import Hello
from gradwatch.wire import OptimizerInfo
from tests.serverproc import ServerProc

NDJSON = {"Content-Type": "application/x-ndjson"}


def _call(url: str, data: bytes, method: str = "POST",
          headers: dict[str, str] = NDJSON) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_renames_that_are_not_plain_text_are_refused(tmp_path: Path) -> None:
    with ServerProc(tmp_path / "data") as srv:
        status, got = _call(f"{srv.http}/api/runs/import",
                            synth.log_text(synth.records("r1", steps=2)).encode())
        assert status == 201
        url = f"{srv.http}/api/runs/r1"
        json_h = {"Content-Type": "application/json"}
        for body, why in ((b'{"name": "x\\ud800y"}', "lone surrogate"),
                          ('{"name": "invoice\u202egnp.exe"}'.encode(), "bidirectional"),
                          ('{"name": "a\u0085b"}'.encode(), "control characters")):
            status, got = _call(url, body, "PATCH", json_h)
            assert status == 400 and why in got["detail"], (body, got)
        assert srv.get("/api/runs/r1")["name"] == "r1"


@pytest.mark.parametrize("rid", [".", ".."])
def test_run_ids_dot_and_dotdot_are_refused(tmp_path: Path, rid: str) -> None:
    lines = [r.model_dump(mode="json") for r in synth.records("r", steps=2)]
    lines[0]["run"] = rid
    text = "\n".join(json.dumps(x) for x in lines) + "\n"
    with ServerProc(tmp_path / "data") as srv:
        status, got = _call(f"{srv.http}/api/runs/import", text.encode())
        assert status == 400 and f"a run id cannot be '{rid}'" in got["detail"], got
        with connect(f"{srv.ws}/ws/ingest", open_timeout=5) as ws:
            ws.send(json.dumps({**Hello(run="x").model_dump(), "run": rid}))
            with pytest.raises(ConnectionClosed) as e:
                ws.recv(timeout=10)
        assert e.value.rcvd is not None and e.value.rcvd.code == 1007
        assert srv.get("/api/runs") == {"runs": []}


def test_check_escapes_terminal_sequences_from_a_log(tmp_path: Path) -> None:
    evil = "\x1b]8;;http://evil.example\x1b\\SGD\x1b[2J\u202e"
    log = tmp_path / "evil.jsonl"
    # the raw characters, as a log written before names were escaped on the wire holds them
    log.write_text(synth.log_text(synth.records("evil", steps=40, stale_from=10, opt="EVIL"))
                   .replace('"EVIL"', json.dumps(evil)))
    r = subprocess.run([sys.executable, "-m", "gradwatch.cli", "check", str(log)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "\x1b" not in r.stdout and "\u202e" not in r.stdout
    assert "\\x1b]8;;http://evil.example\\x1b\\SGD\\x1b[2J\\u202e" in r.stdout


def test_a_run_holds_a_bounded_number_of_optimizers(tmp_path: Path) -> None:
    recs = synth.records("many", steps=2)
    extra = [OptimizerInfo(seq=0, t=1000.0, opt=f"SGD#{i}", cls="SGD", params=["w"],
                           shapes=[[1]]) for i in range(1, 300)]
    lines = [json.dumps(r.model_dump(mode="json")) for r in recs]
    text = "\n".join([*lines[:2], *(json.dumps(
        {**o.model_dump(mode="json"), "seq": 2 + i}) for i, o in enumerate(extra))]) + "\n"
    with ServerProc(tmp_path / "data") as srv:
        status, got = _call(f"{srv.http}/api/runs/import", text.encode())
        assert status == 400, got
        assert got["detail"] == ("a run holds at most 256 optimizers ('SGD#256' would be one "
                                 "more); watch fewer, or give parameter groups to one")
        assert srv.get("/api/runs") == {"runs": []}
