"""On a real server: every string a record carries is bounded, on ingest and on import,
and one over its bound is refused naming the field (nothing stored)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import synth
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from gradwatch.wire import ARG_MAX_CHARS, ARGV_MAX_CHARS, NAME_MAX_CHARS, bounded_argv
from tests.serverproc import ServerProc


def _long(field: str) -> list[Any]:
    recs = synth.records("long", steps=3)
    if field == "argv item":
        recs[0] = recs[0].model_copy(update={"argv": ["train.py", "x" * (ARG_MAX_CHARS + 1)]})
    elif field == "argv total":
        recs[0] = recs[0].model_copy(update={"argv": ["y" * ARG_MAX_CHARS] * 9})
    elif field == "param name":
        recs[1] = recs[1].model_copy(update={"params": ["w0", "n" * (NAME_MAX_CHARS + 1),
                                                        "w2"]})
    elif field == "label":
        recs[1] = recs[1].model_copy(update={"label": "l" * 201})
    return recs


CASES = {"argv item": "argv[1]", "argv total": "argv", "param name": "params[1]",
         "label": "label"}


@pytest.mark.parametrize("field", list(CASES))
def test_a_string_over_its_bound_is_refused_naming_the_field(tmp_path: Path,
                                                             field: str) -> None:
    recs = _long(field)
    text = "\n".join(json.dumps(r.model_dump(mode="json")) for r in recs) + "\n"
    with ServerProc(tmp_path / "data") as srv:
        req = urllib.request.Request(f"{srv.http}/api/runs/import", data=text.encode(),
                                     headers={"Content-Type": "application/x-ndjson"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=30)
        detail = json.loads(e.value.read())["detail"]
        assert e.value.code == 400 and CASES[field] in detail, detail
        frame = '{"type":"batch","v":1,"run":"long","rank":0,"records":[' + ",".join(
            text.splitlines()) + "]}"
        with connect(f"{srv.ws}/ws/ingest", open_timeout=5) as ws:
            ws.send(frame)
            with pytest.raises(ConnectionClosed) as c:
                ws.recv(timeout=10)
        assert c.value.rcvd is not None and c.value.rcvd.code == 1007
        assert CASES[field] in c.value.rcvd.reason, c.value.rcvd.reason
        assert srv.get("/api/runs") == {"runs": []}


def test_the_probe_shortens_what_it_sends_to_the_bounds() -> None:
    argv = bounded_argv(["train.py", "a" * 10_000, *["b" * 4000] * 20])
    assert argv[1] == "a" * (ARG_MAX_CHARS - 1) + "…"
    assert sum(map(len, argv)) <= ARGV_MAX_CHARS and len(argv) < 22
    synth.header().model_copy(update={"argv": argv}).model_validate(
        {**synth.header().model_dump(), "argv": argv})
