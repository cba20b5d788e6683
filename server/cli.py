"""``gradwatch serve``: run the server (uvicorn + ``create_app``) on a data directory.

Exit codes: 0 after a clean stop, 2 for bad arguments (bad port, unusable data directory,
a non-loopback address without a token, an invalid ``--import`` log).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from gradwatch.cliargs import CommandParser
from gradwatch.server.settings import Settings, default_data_dir, is_loopback

log = logging.getLogger("gradwatch.server")


def _parser() -> CommandParser:
    p = CommandParser(prog="gradwatch serve", description="Start the gradwatch server and "
                                                    "dashboard.")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    p.add_argument("--port", type=int, default=8765, help="port (default 8765)")
    p.add_argument("--data", type=Path, default=None,
                   help="data directory (default $GRADWATCH_DATA or ./gradwatch-data)")
    p.add_argument("--token", default=None, help="require this token (or GRADWATCH_TOKEN)")
    p.add_argument("--insecure-no-token", action="store_true",
                   help="allow a non-loopback bind without a token (container behind a "
                        "loopback-only port mapping)")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="LOG",
                   help="store a saved step log as a run before serving (repeatable)")
    p.add_argument("--import-only", action="store_true",
                   help="import the --import logs and exit without serving")
    p.add_argument("--max-frame-bytes", type=int, default=1 << 20)
    p.add_argument("--max-msgs-per-sec", type=float, default=200.0)
    p.add_argument("--max-runs", type=int, default=1000)
    p.add_argument("--max-live-clients", type=int, default=200)
    p.add_argument("--interrupted-after", type=float, default=10.0,
                   help="seconds without a stream before a live run reads as interrupted")
    p.add_argument("--send-timeout", type=float, default=10.0,
                   help="seconds a live client's socket may stay blocked before it is dropped")
    p.add_argument("--parse-processes", type=int, default=1,
                   help="worker processes validating ingest frames (0: a thread)")
    p.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                   help="extra browser origin allowed on the websockets")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"])
    return p


def settings_from_args(argv: Sequence[str]) -> tuple[Settings, argparse.Namespace]:
    """Parse and check arguments. Raises SystemExit(2) with a message on bad ones."""
    p = _parser()
    a = p.parse_args(argv)
    if not 0 < a.port < 65536:
        p.error(f"--port {a.port} is not a port number (1-65535)")
    for name in ("max_frame_bytes", "max_runs", "max_live_clients"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if a.max_msgs_per_sec <= 0:
        p.error("--max-msgs-per-sec must be positive")
    token = a.token or os.environ.get("GRADWATCH_TOKEN") or None
    if not is_loopback(a.host) and not token:
        if not a.insecure_no_token:
            p.error(f"binding {a.host} (not loopback) requires --token TOKEN or "
                    f"GRADWATCH_TOKEN; anyone who can reach the port could read and write "
                    f"runs")
        log.warning("!!! serving on %s WITHOUT a token (--insecure-no-token): anyone who can "
                    "reach this port can read, write and delete runs !!!", a.host)
    data = a.data or default_data_dir()
    try:
        data.mkdir(parents=True, exist_ok=True)
        probe = data / ".gradwatch-write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        p.error(f"data directory {data} is not writable: {e.strerror or e}")
    s = Settings(host=a.host, port=a.port, data_dir=data, token=token,
                 max_frame_bytes=a.max_frame_bytes, max_msgs_per_sec=a.max_msgs_per_sec,
                 max_runs=a.max_runs, max_live_clients=a.max_live_clients,
                 interrupted_after=a.interrupted_after, send_timeout=a.send_timeout,
                 parse_processes=max(0, a.parse_processes),
                 allowed_origins=tuple(a.allow_origin))
    return s, a


def import_logs(settings: Settings, paths: Sequence[str]) -> int:
    """Store step logs as runs; 0, or 2 after printing why a log is invalid."""
    from gradwatch.server.errors import Refused
    from gradwatch.server.storage import Store
    from gradwatch.steplog import StepLogError, read_log

    logs = []
    for path in paths:
        try:
            logs.append(read_log(path))
        except StepLogError as e:
            print(f"gradwatch serve: cannot import {e}", file=sys.stderr)
            return 2
    store = Store(settings.data_dir, max_runs=settings.max_runs)
    store.start()
    try:
        for path, lg in zip(paths, logs, strict=True):
            for w in lg.warnings:
                print(f"gradwatch serve: warning: {w}", file=sys.stderr)
            try:
                run_id, n = store.call(store.import_log, lg.header, lg.records)
            except Refused as e:
                print(f"gradwatch serve: cannot import {path}: {e.reason}", file=sys.stderr)
                return 2
            print(f"imported {path} as run {run_id} ({n} steps)")
    finally:
        store.close()
    return 0


def main(argv: Sequence[str]) -> int:
    """Entry point of ``gradwatch serve``."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    settings, a = settings_from_args(argv)
    if a.imports:
        rc = import_logs(settings, a.imports)
        if rc or a.import_only:
            return rc
    import uvicorn

    from gradwatch.server.app import create_app

    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    hint = "?token=<your token>" if settings.token else ""
    print(f"gradwatch: dashboard at http://{host}:{settings.port}/{hint}  "
          f"(data in {settings.data_dir})", flush=True)
    try:
        uvicorn.run(create_app(settings), host=settings.host, port=settings.port,
                    log_level=a.log_level, ws_max_size=settings.max_frame_bytes * 4 + 4096,
                    ws_ping_interval=20.0, ws_ping_timeout=60.0)
    except OSError as e:
        print(f"gradwatch serve: cannot listen on {host}:{settings.port}: {e}",
              file=sys.stderr)
        return 2
    return 0
