"""Step logs: strict reading with line numbers, tolerance of a truncated last line only."""

from __future__ import annotations

import gzip
import io
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from gradwatch import check
from gradwatch.steplog import BLOCK, GZIP_MAGIC, LogReader, StepLogError, StepLogWriter, read_log
from gradwatch.wirejson import dump_record
from tests.core.logs import clean_log, header, missed_reset_log, step, write


def test_writer_output_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    with StepLogWriter(path) as w:
        w.write(header())
        for r in clean_log(3):
            w.write(r)
    log = read_log(path)
    assert log.header.run == "run1"
    assert [r.type for r in log.records] == ["optimizer", "step", "step", "step", "end"]
    assert log.warnings == []


def test_writer_flushes_so_a_reader_sees_lines_while_it_writes(tmp_path: Path) -> None:
    path = tmp_path / "live.jsonl"
    w = StepLogWriter(path, flush_every=0.0)
    w.write(header())
    w.write(step(1, 0))
    assert len(read_log(path).records) == 1  # readable while the writer is still open
    w.close()


def test_truncated_last_line_is_a_warning_not_an_error(tmp_path: Path) -> None:
    path = write(tmp_path / "crash.jsonl", clean_log(2))
    with path.open("a") as fh:
        fh.write('{"seq": 9, "t": 1.0, "type": "st')  # the process died mid-line
    log = read_log(path)
    assert len(log.records) == 4
    assert "truncated" in log.warnings[0] and ":6:" in log.warnings[0]


def test_a_bad_line_in_the_middle_names_line_and_field(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.jsonl", clean_log(2))
    lines = path.read_text().splitlines()
    lines[2] = lines[2].replace('"step":0', '"step":"zero"')
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(StepLogError) as e:
        read_log(path)
    assert e.value.line == 3
    assert "step" in str(e.value) and "bad.jsonl:3" in str(e.value)


@pytest.mark.parametrize("content, expected", [
    ("", "empty"),
    ("hello world\n", "not a gradwatch step log"),
    ('{"level": "info", "msg": "epoch 1"}\n', "not a gradwatch step log .line 1 is JSON "
                                              "without a 'type' field"),  # another tool's
    ('{"seq": 1, "t": 1, "type": "stats"}\n', "first line must be the header"),
])
def test_unreadable_logs_say_why(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text(content)
    with pytest.raises(StepLogError, match=expected):
        read_log(path)


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(StepLogError, match="cannot open"):
        read_log(tmp_path / "nope.jsonl")


def test_a_named_pipe_nobody_writes_into_is_an_error_at_once_not_a_hang(
        tmp_path: Path) -> None:
    fifo = tmp_path / "run.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(StepLogError, match="a pipe that no process writes into"):
        read_log(fifo)  # an open that waited for a writer would never return


def test_a_compressed_log_cut_mid_stream_is_read_up_to_the_cut_and_said(
        tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl.gz"
    whole = gzip.compress(_lines_of(clean_log(40)).encode())
    path.write_bytes(whole[:len(whole) // 2])
    log = read_log(path)
    assert log.records and log.records[-1].type != "end"
    assert any("compressed log ends mid-stream" in w for w in log.warnings), log.warnings


def test_a_new_step_log_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "private.jsonl"
    with StepLogWriter(path) as w:
        w.write(header())
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def _lines_of(records: list[Any]) -> str:
    return "".join(dump_record(r) + "\n" for r in [header(), *records])


def test_a_log_named_gz_is_written_compressed_and_read_back_while_it_is_written(
        tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl.gz"
    w = StepLogWriter(path, flush_every=0.0)  # a sync flush per line
    w.write(header())
    for r in clean_log(3):
        w.write(r)
    assert path.read_bytes()[:2] == GZIP_MAGIC
    assert len(read_log(path).records) == 5  # the writer has not closed the stream
    w.close()
    log = read_log(path)
    assert [r.type for r in log.records] == ["optimizer", "step", "step", "step", "end"]
    assert log.warnings == []


def test_any_log_that_starts_with_gzip_magic_reads_through_gzip(tmp_path: Path) -> None:
    path = tmp_path / "plain-name.jsonl"
    path.write_bytes(gzip.compress(_lines_of(clean_log(2)).encode()))
    assert len(read_log(path).records) == 4


def test_the_reader_streams_a_file_object_and_names_it_in_errors() -> None:
    good = _lines_of(clean_log(2)).encode()
    with LogReader(io.BytesIO(good), "upload.jsonl") as reader:
        assert reader.header.run == "run1"
        assert [r.type for r in reader] == ["optimizer", "step", "step", "end"]
    bad = good.replace(b'"step":1', b'"step":-1')
    with pytest.raises(StepLogError, match=r"^upload\.jsonl:4: .*step"):
        list(LogReader(io.BytesIO(gzip.compress(bad)), "upload.jsonl"))


def test_an_error_deep_in_a_long_log_names_its_file_line_and_field(tmp_path: Path) -> None:
    recs = clean_log(3 * BLOCK)
    text = _lines_of(recs).splitlines()
    bad_line = 2 * BLOCK + 7
    text[bad_line - 1] = text[bad_line - 1].replace('"consumed":2', '"consumed":"two"')
    path = tmp_path / "long.jsonl"
    path.write_text("\n".join(text) + "\n")
    reader = LogReader(path)
    seen = 0
    with pytest.raises(StepLogError) as e:
        for _ in reader:
            seen += 1
    assert e.value.line == bad_line and f"long.jsonl:{bad_line}:" in str(e.value)
    assert "consumed" in str(e.value)
    assert seen >= BLOCK  # records before the bad block came out before it was read


def test_a_second_header_is_refused_where_it_is(tmp_path: Path) -> None:
    path = tmp_path / "two.jsonl"
    path.write_text(_lines_of(clean_log(1)) + _lines_of(clean_log(1)))
    with pytest.raises(StepLogError, match=r"two\.jsonl:5: a second header"):
        read_log(path)


def test_check_judges_a_compressed_log_as_the_plain_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plain = write(tmp_path / "run.jsonl", missed_reset_log())
    packed = tmp_path / "run.jsonl.gz"
    with StepLogWriter(packed) as w:
        for line in plain.read_text().splitlines():
            w.write(line)
    assert check.main(["--json", str(plain)]) == 1
    from_plain = json.loads(capsys.readouterr().out)
    assert check.main(["--json", str(packed)]) == 1
    assert json.loads(capsys.readouterr().out) == from_plain
    assert from_plain["findings"][0]["kind"] == "missed_reset"
