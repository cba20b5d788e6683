"""Import reads a step log at its header's version, plain or compressed."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import synth
from fastapi.testclient import TestClient

from gradwatch.steplog import read_log
from gradwatch.wire import PROTOCOL_VERSION

NDJSON = {"content-type": "application/x-ndjson"}
FIXTURES = Path(__file__).parents[1] / "core" / "fixtures"


def test_a_gzip_compressed_log_imports_as_the_plain_one(client: TestClient) -> None:
    text = synth.log_text(synth.records(steps=30, stale_from=10))
    r = client.post("/api/runs/import", content=gzip.compress(text.encode()), headers=NDJSON)
    assert r.status_code == 201 and r.json() == {"run": "run1", "steps": 30, "warnings": []}
    kinds = {f["kind"] for f in client.get("/api/runs/run1/findings").json()["findings"]}
    assert kinds == {"missed_reset"}


@pytest.mark.parametrize("name", ["probe_v1", "hand_v1", "probe_v2", "hand_v2"])
def test_an_older_log_imports_and_its_export_reads_the_same(client: TestClient,
                                                            tmp_path: Path, name: str) -> None:
    old_log = tmp_path / "old.jsonl"
    # hand_v* jump to the largest step number and back: storage must not walk the gap
    old_log.write_text((FIXTURES / f"{name}.jsonl").read_text())
    original = read_log(old_log)
    assert original.header.v == int(name[-1])
    r = client.post("/api/runs/import", content=old_log.read_bytes(), headers=NDJSON)
    assert r.status_code == 201
    exported = tmp_path / "export.jsonl"
    exported.write_text(client.get(f"/api/runs/{r.json()['run']}/export",
                                   params={"rank": original.header.rank}).text)
    back = read_log(exported)
    assert back.header.v == PROTOCOL_VERSION  # written again today, every record the same
    assert [x.model_dump_json() for x in back.records] == \
        [x.model_dump_json() for x in original.records]
