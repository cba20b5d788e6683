"""Frames are validated once, where they enter the server, in a worker process if asked."""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing
import subprocess

import pytest
import synth

from gradwatch.frames import Hello
from gradwatch.server.batch import Batch
from gradwatch.server.errors import InvalidFrame, UnreadableFrame
from gradwatch.server.parsing import INLINE_BYTES, FrameParser, parse_frame
from gradwatch.wire import OptimizerInfo, Step, parse_record


def test_a_frame_becomes_entries_with_the_validated_records_storage_reads() -> None:
    recs = synth.records(steps=6, stale_from=3)
    batch = parse_frame(synth.batches(recs, size=100)[0])
    assert isinstance(batch, Batch) and (batch.run, batch.rank) == ("run1", 0)
    kinds = [(e.kind, type(e.record).__name__ if e.record else None) for e in batch.entries]
    assert kinds == [("header", "Header"), ("optimizer", "OptimizerInfo"),
                     *[("step", None)] * 3, *[("step", "Step")] * 3, ("end", "End")]
    assert [e.row.step for e in batch.entries if e.row] == list(range(6))
    # the stored line is the record, as valid as it came (no None fields, read back at
    # version 1); a step without a finding fact lives in its columns only
    assert OptimizerInfo.model_validate_json(batch.entries[1].body) == recs[1]
    assert "null" not in batch.entries[1].body
    assert batch.entries[2].body == "" and batch.entries[2].cols is not None
    assert parse_record(batch.entries[5].body, 1) == recs[5]


@pytest.mark.parametrize(("text", "error", "words"), [
    ("not json", UnreadableFrame, "not JSON"),
    ('{"type":"batch","v":1,"run":"r","rank":0,"records":[{"type":"step"}]}', InvalidFrame,
     r"^invalid frame: fields 'seq', 't', 'opt', 'step' of record 0 \('step'\) are "
     r"missing$"),
    ('{"type":"hello","v":1,"run":"bad id!"}', InvalidFrame,
     r"^invalid frame: field 'run' of the 'hello' frame is \"bad id!\": it must match "),
])
def test_bad_frames_are_refused_with_what_was_wrong(text: str, error: type, words: str) -> None:
    with pytest.raises(error, match=words):
        parse_frame(text)


def fields(batch: Batch) -> list[tuple]:
    return [(e.seq, e.kind, e.t, e.body, e.row, e.record) for e in batch.entries]


async def test_worker_processes_validate_big_frames_as_the_server_would() -> None:
    recs = synth.records(steps=400, stale_from=350)
    big = synth.batches(recs, size=1000)[0]
    bad = json.loads(big)
    bad["records"][300]["norm"] = "very large"
    assert len(big) > INLINE_BYTES
    parser = FrameParser(processes=1)
    parser.start()
    try:
        got = await parser.parse(big)
        want = parse_frame(big)
        assert isinstance(got, Batch) and isinstance(want, Batch)
        assert (got.run, got.rank, fields(got)) == (want.run, want.rank, fields(want))
        assert isinstance(got.entries[-2].record, Step) and got.entries[5].record is None
        with pytest.raises(InvalidFrame, match=r"field 'norm' of record 300 \('step'\) is"):
            await parser.parse(json.dumps(bad))
        assert isinstance(await parser.parse(Hello(run="run1").model_dump_json()), Hello)
    finally:
        parser.close()


async def test_stopping_the_parser_finishes_the_frames_it_holds_and_ends_its_processes(
        caplog: pytest.LogCaptureFixture) -> None:
    parser = FrameParser(processes=2)
    parser.start()
    await parser.started()
    procs = multiprocessing.active_children()
    assert len(procs) == 2
    # Work a worker holds when the server stops (a shell sleep: it outlasts the call to
    # close below) is finished there, not lost with the process (nor done again in a
    # thread once its process is gone, with an error logged).
    held = asyncio.ensure_future(parser.run(subprocess.getoutput, "sleep 0.5; echo parsed"))
    await asyncio.sleep(0.05)  # submitted
    parser.close()
    assert await held == "parsed"
    assert not [p for p in procs if p.is_alive()]
    assert not [r.message for r in caplog.records if r.levelno >= logging.WARNING]
