"""Import streamed from the request: a block at a time, stored whole or not at all, in
memory that does not grow with the log."""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path

import synth
from fastapi.testclient import TestClient

from gradwatch.server.runs import Runs
from gradwatch.server.settings import Settings

NDJSON = {"content-type": "application/x-ndjson"}


def test_a_bad_line_far_into_a_long_log_stores_nothing(client: TestClient) -> None:
    lines = synth.log_text(synth.records(steps=8000)).splitlines()
    assert sum(map(len, lines)) > 3 << 20  # several blocks: the first ones are stored
    lines[7001] = lines[7001].replace('"backwards":1', '"backwards":-1')
    r = client.post("/api/runs/import", content="\n".join(lines) + "\n", headers=NDJSON)
    assert r.status_code == 400
    assert r.json()["detail"].startswith("upload:7002: ") and "backwards" in r.json()["detail"]
    assert client.get("/api/runs").json() == {"runs": []}
    ok = client.post("/api/runs/import", content="\n".join(lines[:7001]) + "\n",
                     headers=NDJSON)
    assert ok.status_code == 201 and ok.json()["steps"] == 6999


def _peak(tmp: Path, steps: int) -> int:
    body = synth.log_text(synth.records("big", steps=steps)).encode()

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(body), 1 << 16):
            yield body[i:i + (1 << 16)]

    async def run() -> int:
        runs = Runs(Settings(data_dir=tmp / str(steps)))
        runs.start()
        try:
            tracemalloc.start()
            _, n, _ = await runs.import_stream(chunks())
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        finally:
            runs.close()
        assert n == steps
        return peak

    return asyncio.run(run())


def test_import_memory_does_not_grow_with_the_log(tmp_path: Path) -> None:
    small, big = _peak(tmp_path, 2000), _peak(tmp_path, 16_000)
    assert big - small < 4 << 20, (small, big)  # the log alone grows by ~8 MB

