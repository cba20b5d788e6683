"""The probe's stream key: kept beside its step log, private, reused by a log appended to."""

from __future__ import annotations

import stat
from pathlib import Path

from gradwatch.frames import Hello
from gradwatch.streamkey import key_file, own_key, read_key


def test_the_key_is_made_once_kept_private_and_read_back(tmp_path: Path) -> None:
    log = tmp_path / "runs" / "run.jsonl"
    assert read_key(log) is None
    key = own_key(log)
    assert key_file(log) == tmp_path / "runs" / "run.jsonl.key"
    assert stat.S_IMODE(key_file(log).stat().st_mode) == 0o600
    assert own_key(log) == key == read_key(log)  # a log appended to keeps its stream
    Hello(run="r", key=key)  # a key the wire takes
    assert own_key(tmp_path / "other.jsonl") != key


def test_a_malformed_key_file_is_ignored_and_replaced(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    key_file(log).write_text("not a key!\n")
    assert read_key(log) is None
    key = own_key(log)
    assert read_key(log) == key and len(key) >= 32
