"""The probe's stream key: kept beside its step log, private, reused by a log appended to."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gradwatch.frames import Hello
from gradwatch.streamkey import UnsafeKeyFile, key_file, own_key, read_key


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
    key_file(log).chmod(0o600)
    assert read_key(log) is None
    key = own_key(log)
    assert read_key(log) == key and len(key) >= 32


def test_a_key_file_open_to_others_or_foreign_is_never_adopted(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    planted = own_key(tmp_path / "theirs.jsonl")
    key_file(log).write_text(planted + "\n")
    for mode in (0o644, 0o640, 0o604, 0o660):
        key_file(log).chmod(mode)
        with pytest.raises(UnsafeKeyFile, match=f"{key_file(log)} is open to other users"):
            own_key(log)
        with pytest.raises(UnsafeKeyFile):
            read_key(log)
    key_file(log).chmod(0o600)
    if os.getuid() == 0:  # only root can give a file away
        os.chown(key_file(log), 65534, 65534)
        with pytest.raises(UnsafeKeyFile, match="belongs to another user"):
            own_key(log)
        os.chown(key_file(log), 0, 0)
    assert own_key(log) == planted  # our own private file: adopted


def test_a_symlink_or_a_directory_where_the_key_goes_is_refused_and_not_written_through(
        tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    target = tmp_path / "victim"
    key_file(log).symlink_to(target)  # dangling: creating the key would make ``victim``
    with pytest.raises(UnsafeKeyFile, match="is a symlink"):
        own_key(log)
    assert not target.exists()
    target.write_text("precious\n")
    target.chmod(0o600)
    with pytest.raises(UnsafeKeyFile, match="is a symlink"):
        own_key(log)
    assert target.read_text() == "precious\n"
    key_file(log).unlink()
    key_file(log).mkdir()
    with pytest.raises(UnsafeKeyFile, match="not a regular file"):
        own_key(log)
