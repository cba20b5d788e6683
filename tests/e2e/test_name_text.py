"""On a real server: a name that arrives by ingest or import (run name, optimizer name and
label, parameter name) holding a bidi or control character is stored and shown escaped,
under the same rule a rename refuses by (``gradwatch.wire.name_problem``); a log written
before that rule still imports whole, and text that is not Unicode is refused."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import synth
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.serverproc import ServerProc

NDJSON = {"Content-Type": "application/x-ndjson"}
# what an older probe wrote as it was given: an override that shows "invoice\u202egnp.exe"
# as "invoiceexe.png", a terminal escape, an isolate, a right-to-left mark, a C1 control
RAW = {"RUNNAME": "invoice\u202egnp.exe", "OPTNAME": "SGD\x1b[2J", "LABELNAME": "g\u2066en",
       "PARAMNAME": "enc.\u200fw\u0085"}
SHOWN = {"RUNNAME": "invoice\\u202egnp.exe", "OPTNAME": "SGD\\x1b[2J",
         "LABELNAME": "g\\u2066en", "PARAMNAME": "enc.\\u200fw\\x85"}


def _old_log(run: str) -> list[dict[str, Any]]:
    """A log's records (JSON objects) whose names hold the RAW characters, as bytes on disk."""
    recs = synth.records(run, steps=5, stale_from=2, opt="OPTNAME")
    recs[0] = recs[0].model_copy(update={"run_name": "RUNNAME"})
    recs[1] = recs[1].model_copy(update={"label": "LABELNAME",
                                         "params": ["PARAMNAME", "w1", "w2"]})
    text = synth.log_text(recs)
    for mark, raw in RAW.items():
        text = text.replace(f'"{mark}"', json.dumps(raw))  # \u escapes: the JSON a log holds
    return [json.loads(line) for line in text.splitlines()]


def _assert_shown_escaped(srv: ServerProc, run: str) -> None:
    got = srv.get(f"/api/runs/{run}")
    assert got["name"] == SHOWN["RUNNAME"]
    (opt,) = got["optimizers"]
    assert (opt["opt"], opt["label"], opt["params"][0]) == (
        SHOWN["OPTNAME"], SHOWN["LABELNAME"], SHOWN["PARAMNAME"])
    assert got["steps"] == 5
    findings = srv.get(f"/api/runs/{run}/findings")["findings"]
    assert findings and all("\x1b" not in json.dumps(f, ensure_ascii=False) for f in findings)


def test_names_from_an_import_are_stored_escaped_and_the_log_imports_whole(
        tmp_path: Path) -> None:
    text = "".join(json.dumps(r) + "\n" for r in _old_log("old"))
    assert "\\u202e" in text and "\\u001b" in text
    with ServerProc(tmp_path / "data") as srv:
        req = urllib.request.Request(f"{srv.http}/api/runs/import", data=text.encode(),
                                     headers=NDJSON)
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 201 and json.loads(r.read())["steps"] == 5
        _assert_shown_escaped(srv, "old")
        # the rename rule is the same rule: the name as stored is a name a rename may give
        req = urllib.request.Request(f"{srv.http}/api/runs/old", method="PATCH",
                                     data=json.dumps({"name": SHOWN["RUNNAME"]}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200


def test_names_from_ingest_are_stored_escaped(tmp_path: Path) -> None:
    recs = _old_log("live")
    frame = json.dumps({"type": "batch", "v": 1, "run": "live", "rank": 0, "records": recs})
    with ServerProc(tmp_path / "data") as srv:
        with connect(f"{srv.ws}/ws/ingest", open_timeout=5) as ws:
            ws.send(frame)
            deadline = time.monotonic() + 30
            while srv.get("/api/runs")["runs"] == [] or srv.get(
                    "/api/runs/live")["status"] == "live":
                assert time.monotonic() < deadline, srv.get("/api/runs")
                time.sleep(0.1)
        _assert_shown_escaped(srv, "live")


def test_a_lone_surrogate_in_a_name_is_refused_on_ingest_and_import(tmp_path: Path) -> None:
    lines = [json.dumps(r) for r in _old_log("bad")]
    lines[0] = lines[0].replace("invoice", "\\ud800")
    with ServerProc(tmp_path / "data") as srv:
        req = urllib.request.Request(f"{srv.http}/api/runs/import",
                                     data="\n".join(lines).encode(), headers=NDJSON)
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=30)
        detail = json.loads(e.value.read())["detail"]
        assert e.value.code == 400 and "upload:1:" in detail and "surrogate" in detail, detail
        frame = ('{"type":"batch","v":1,"run":"bad","rank":0,"records":[' + ",".join(lines)
                 + "]}")
        with connect(f"{srv.ws}/ws/ingest", open_timeout=5) as ws:
            ws.send(frame)
            with pytest.raises(ConnectionClosed) as c:
                ws.recv(timeout=10)
        # a lone surrogate is not JSON text: the frame is refused before any record is read
        assert c.value.rcvd is not None and c.value.rcvd.code == 1003, c.value.rcvd
        assert "not JSON" in c.value.rcvd.reason
        assert srv.get("/api/runs") == {"runs": []}
