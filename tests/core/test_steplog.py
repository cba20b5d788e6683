"""Step logs: strict reading with line numbers, tolerance of a truncated last line only."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from gradwatch.steplog import StepLogError, StepLogWriter, read_log
from tests.core.logs import clean_log, header, step, write


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


def test_a_new_step_log_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "private.jsonl"
    with StepLogWriter(path) as w:
        w.write(header())
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
