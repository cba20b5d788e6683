"""``gradwatch serve`` argument checks (without starting a server)."""

from __future__ import annotations

import logging
import stat
import sys
from pathlib import Path

import pytest

from gradwatch.server.cli import settings_from_args
from gradwatch.server.settings import Settings, is_loopback


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


def test_every_limit_has_a_flag_whose_default_is_the_settings_default(
        tmp_path: Path) -> None:
    flags = {"max_frame_bytes": "--max-frame-bytes", "max_msgs_per_sec": "--max-msgs-per-sec",
             "max_ingest_connections": "--max-ingest-connections",
             "ingest_idle_timeout": "--ingest-idle-timeout", "max_runs": "--max-runs",
             "ingest_hello_timeout": "--ingest-hello-timeout",
             "max_live_clients": "--max-live-clients", "live_backlog": "--live-backlog",
             "send_timeout": "--send-timeout", "header_timeout": "--header-timeout",
             "max_header_bytes": "--max-header-bytes",
             "keep_alive_timeout": "--keep-alive-timeout",
             "ping_interval": "--ping-interval", "ping_timeout": "--ping-timeout",
             "interrupted_after": "--interrupted-after",
             "max_import_bytes": "--max-import-bytes", "max_line_bytes": "--max-line-bytes"}
    data = ["--data", str(tmp_path)]
    default, _ = settings_from_args(data)
    assert default.allowed_hosts == () and default.allowed_origins == ()
    for field, flag in flags.items():
        assert getattr(default, field) == getattr(Settings(), field), field
        s, _ = settings_from_args([flag, "7", *data])
        assert getattr(s, field) == 7, field
        with pytest.raises(SystemExit):
            settings_from_args([flag, "-1", *data])
    s, _ = settings_from_args(["--allow-host", "gw.lan", "--allow-host", "box", *data])
    assert s.allowed_hosts == ("gw.lan", "box")


def test_the_data_directory_is_made_private(tmp_path: Path) -> None:
    open_dir = tmp_path / "data"
    open_dir.mkdir(mode=0o755)
    old_db = open_dir / "gradwatch.db"
    old_db.touch(mode=0o644)
    open_dir.chmod(0o755)
    old_db.chmod(0o644)
    settings_from_args(["--data", str(open_dir)])
    assert stat.S_IMODE(open_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(old_db.stat().st_mode) == 0o600
    fresh = tmp_path / "new" / "data"
    settings_from_args(["--data", str(fresh)])
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o700
    assert stat.S_IMODE((fresh / "gradwatch.db").stat().st_mode) == 0o600


def test_keep_param_norms_every_n(tmp_path: Path) -> None:
    data = ["--data", str(tmp_path)]
    assert settings_from_args(data)[0].keep_param_norms == 1
    assert settings_from_args(["--keep-param-norms", "every", "10", *data])[0] \
        .keep_param_norms == 10
    for bad in (["every", "0"], ["each", "10"], ["every", "x"]):
        with pytest.raises(SystemExit):
            settings_from_args(["--keep-param-norms", *bad, *data])


def test_serve_refuses_a_database_of_a_newer_gradwatch(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import sqlite3

    from gradwatch.server.cli import main
    from gradwatch.server.db import DB_NAME

    c = sqlite3.connect(tmp_path / DB_NAME)
    c.execute("PRAGMA user_version=7")
    c.commit()
    c.close()
    assert main(["--data", str(tmp_path), "--import-only"]) == 2
    assert "newer gradwatch" in capsys.readouterr().err


def test_serve_settles_its_heap_once_the_app_is_built_and_before_serving(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import uvicorn
    from fastapi import FastAPI

    import gradwatch.gcpause
    from gradwatch.server.cli import main

    calls: list[str] = []
    # Recorded, not run: a freeze in pytest's process would hold the suite's heap.
    monkeypatch.setattr(gradwatch.gcpause, "settle_server_heap",
                        lambda: calls.append("settle"))
    monkeypatch.setattr(uvicorn, "run",
                        lambda app, **kw: calls.append(f"run {type(app).__name__}"))
    assert main(["--data", str(tmp_path), "--port", "1"]) == 0
    assert calls == ["settle", f"run {FastAPI.__name__}"]


def test_db_chooses_the_database_and_names_what_is_missing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("GRADWATCH_DB", raising=False)
    data = ["--data", str(tmp_path)]
    s, _ = settings_from_args(data)
    assert s.db is None and s.database() == tmp_path  # SQLite in --data: the default
    url = "postgresql://alice:pw-secret@db.lan:5432/gw"
    monkeypatch.setenv("GRADWATCH_DB", url)
    s, _ = settings_from_args(data)
    assert s.database() == url
    assert "pw-secret" not in repr(s) and "alice:***@db.lan" in repr(s)
    monkeypatch.delenv("GRADWATCH_DB")
    s, _ = settings_from_args([*data, "--db", f"sqlite://{tmp_path / 'other'}"])
    assert s.db is None and s.data_dir == tmp_path / "other"
    with pytest.raises(SystemExit) as e:
        settings_from_args([*data, "--db", "mysql://u@h/db"])
    assert e.value.code == 2 and "not mysql://" in capsys.readouterr().err
    # without the driver, a PostgreSQL URL is refused with the extra to install
    monkeypatch.setitem(sys.modules, "psycopg", None)
    with pytest.raises(SystemExit):
        settings_from_args([*data, "--db", url])
    err = capsys.readouterr().err
    assert "gradwatch[postgres]" in err and "pw-secret" not in err


def test_a_password_in_db_is_masked_and_warned_about_but_not_from_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    from gradwatch.server.backend import masked, password_of

    monkeypatch.delenv("GRADWATCH_DB", raising=False)
    data = ["--data", str(tmp_path)]
    caplog.set_level(logging.WARNING, logger="gradwatch.server")
    s, _ = settings_from_args([*data, "--db", "postgresql://alice:pw-s3cret@db.lan/gw"])
    assert "visible in ps" in caplog.text and "GRADWATCH_DB" in caplog.text
    assert "pw-s3cret" not in caplog.text and "pw-s3cret" not in repr(s)
    caplog.clear()
    settings_from_args([*data, "--db", "postgresql://alice@db.lan/gw"])  # ~/.pgpass
    monkeypatch.setenv("GRADWATCH_DB", "postgresql://alice:pw-s3cret@db.lan/gw")
    settings_from_args(data)  # the environment is not in ps
    assert "visible in ps" not in caplog.text
    # libpq's query-parameter form is a password too
    url = "postgresql://alice@db.lan/gw?sslmode=require&password=pw-s3cret"
    assert password_of(url) == "pw-s3cret"
    assert masked(url) == "postgresql://alice@db.lan/gw?sslmode=require&password=***"
    monkeypatch.delenv("GRADWATCH_DB")
    settings_from_args([*data, "--db", url])
    assert "visible in ps" in caplog.text


def test_serve_names_a_port_in_use_and_a_host_it_cannot_listen_on(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    from gradwatch.server.cli import main

    data = ["--data", str(tmp_path)]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        # exit 2 and a sentence, before the dashboard line (uvicorn exited 3 after it)
        assert main(["--port", port, *data]) == 2
        err = capsys.readouterr()
        assert f"port {port} on 127.0.0.1 is in use" in err.err and "dashboard at" not in err.out
    for host, words in (("bad..host", "not an address or a name"),  # was a traceback
                        ("192.0.2.1", "Cannot assign requested address")):
        assert main(["--host", host, "--token", "t", "--port", port, *data]) == 2
        assert words in capsys.readouterr().err


def test_import_only_never_serves_and_a_pipe_is_not_imported(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import os

    from gradwatch.server.cli import main

    data = ["--data", str(tmp_path / "data")]
    assert main([*data, "--import-only"]) == 0  # it started serving before
    assert "nothing imported" in capsys.readouterr().err
    fifo = tmp_path / "run.jsonl"
    os.mkfifo(fifo)  # read twice, validated then stored: a pipe would hang the first read
    assert main([*data, "--import", str(fifo), "--import-only"]) == 2
    assert "named pipe" in capsys.readouterr().err
