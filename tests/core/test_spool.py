"""The streamer's spool reader: complete lines only, in frames, each line validated and sent
as written; what the server has is left out; bad lines are skipped and counted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gradwatch.spool import MAX_LINE, SpoolReader
from gradwatch.wire import IngestBatch
from gradwatch.wirejson import dump_record
from tests.core.logs import header, optimizer, step


def _lines(n: int) -> list[str]:
    return [dump_record(r) for r in (header(), optimizer(),
                                     *(step(2 + i, i) for i in range(n)))]


def _seqs(text: str | None) -> list[int]:
    assert text is not None
    frame = IngestBatch.model_validate_json(text)
    assert frame.run == "run1" and frame.rank == 3
    return [r.seq for r in frame.records]


def test_frames_of_complete_lines_sent_as_written(tmp_path: Path) -> None:
    spool = tmp_path / "run.jsonl"
    reader = SpoolReader(spool, "run1", 3, max_records=4)
    assert reader.read() is None  # no spool yet
    lines = _lines(8)
    spool.write_text("\n".join(lines) + "\n" + lines[-1][:20])  # the probe mid-line
    first = reader.read()
    assert first is not None and first.full and first.records == 4
    assert _seqs(first.text) == [0, 1, 2, 3]
    assert json.loads(first.text or "")["records"][2] == json.loads(lines[2])  # as written
    rest = [reader.read(), reader.read()]
    assert [_seqs(p.text) for p in rest if p] == [[4, 5, 6, 7], [8, 9]]
    assert rest[1] is not None and not rest[1].full
    assert rest[1].end == len("\n".join(lines)) + 1  # the half-written line is not read
    assert reader.read() is None


def test_records_the_server_has_are_left_out_after_a_resume(tmp_path: Path) -> None:
    spool = tmp_path / "run.jsonl"
    spool.write_text("\n".join(_lines(6)) + "\n")
    reader = SpoolReader(spool, "run1", 3)
    reader.seek(0, 4)  # the server said it stores up to seq 4
    piece = reader.read()
    assert piece is not None and _seqs(piece.text) == [5, 6, 7]
    reader.seek(0, 7)  # it has them all: lines read, nothing to send
    had = reader.read()
    assert had is not None and had.text is None and had.end == spool.stat().st_size


def test_an_invalid_line_and_one_too_long_to_send_are_skipped_and_counted(
        tmp_path: Path) -> None:
    lines = _lines(3)
    spool = tmp_path / "run.jsonl"
    spool.write_text("\n".join([*lines[:3], '{"type": "step", "seq": "x"}',
                                "x" * (MAX_LINE + 10), *lines[3:]]) + "\n")
    reader = SpoolReader(spool, "run1", 3)
    got: list[int] = []
    while (piece := reader.read()) is not None:
        if piece.text is not None:
            got += _seqs(piece.text)
    assert got == [0, 1, 2, 3, 4] and reader.dropped == 2


def test_a_spool_must_start_with_its_header(tmp_path: Path) -> None:
    spool = tmp_path / "run.jsonl"
    spool.write_text(dump_record(header())[:30])
    assert SpoolReader(spool, "run1", 3).version() is None  # the header is half-written
    spool.write_text(dump_record(step(2, 0)) + "\n")
    with pytest.raises(ValueError, match="does not start with a header"):
        SpoolReader(spool, "run1", 3).version()


def _frames(reader: SpoolReader) -> list[str | None]:
    out = []
    while (piece := reader.read()) is not None and piece.end > 0 and piece.records:
        out.append(piece.text)
    return out


def test_a_spool_this_process_wrote_is_framed_alike_without_validating_it_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gradwatch import spool as spool_module

    spool = tmp_path / "run.jsonl"
    spool.write_text("\n".join(_lines(12)) + "\n")
    plain = SpoolReader(spool, "run1", 3, max_records=5)
    plain.seek(0, 3)  # the server holds seq 0-3
    want = _frames(plain)
    assert [_seqs(t) for t in want] == [[4, 5, 6, 7, 8], [9, 10, 11, 12, 13]]
    parsed: list[bytes] = []
    real = spool_module.parse_record
    monkeypatch.setattr(spool_module, "parse_record",
                        lambda raw, v: parsed.append(raw) or real(raw, v))
    trusted = SpoolReader(spool, "run1", 3, max_records=5, trusted=True)
    trusted.seek(0, 3)
    assert _frames(trusted) == want
    assert len(parsed) == 1 and b'"type":"header"' in parsed[0]  # the header's version only


def test_a_trusted_spool_still_validates_a_line_that_opens_without_its_seq(
        tmp_path: Path) -> None:
    spool = tmp_path / "run.jsonl"
    lines = _lines(3)
    lines.insert(3, '{"t":1.0,"seq":9,"type":"nope"}')  # not a line gradwatch writes
    spool.write_text("\n".join(lines) + "\n")
    reader = SpoolReader(spool, "run1", 3, trusted=True)
    piece = reader.read()
    assert piece is not None and _seqs(piece.text) == [0, 1, 2, 3, 4]
    assert reader.dropped == 1
