"""``gradwatch serve`` argument checks (without starting a server)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gradwatch.server.cli import settings_from_args
from gradwatch.server.settings import is_loopback


def test_non_loopback_needs_a_token_or_an_explicit_insecure_flag(
        tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GRADWATCH_TOKEN", raising=False)
    data = ["--data", str(tmp_path)]
    with pytest.raises(SystemExit) as e:
        settings_from_args(["--host", "0.0.0.0", *data])
    assert e.value.code == 2
    s, _ = settings_from_args(["--host", "0.0.0.0", "--token", "t", *data])
    assert s.token == "t"
    monkeypatch.setenv("GRADWATCH_TOKEN", "from-env")
    assert settings_from_args(["--host", "::", *data])[0].token == "from-env"
    monkeypatch.delenv("GRADWATCH_TOKEN")
    with caplog.at_level(logging.WARNING):
        s, _ = settings_from_args(["--host", "0.0.0.0", "--insecure-no-token", *data])
    assert s.token is None and "WITHOUT a token" in caplog.text


def test_defaults_are_local_and_limits_are_settable(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRADWATCH_DATA", str(tmp_path / "env-data"))
    s, _ = settings_from_args(["--max-frame-bytes", "4096", "--max-runs", "3"])
    assert s.host == "127.0.0.1" and s.port == 8765 and s.data_dir == tmp_path / "env-data"
    assert s.max_frame_bytes == 4096 and s.max_runs == 3
    for bad in (["--port", "0"], ["--max-runs", "0"], ["--max-msgs-per-sec", "-1"]):
        with pytest.raises(SystemExit):
            settings_from_args(bad)
    assert is_loopback("127.0.0.2") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.2")
