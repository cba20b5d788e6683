"""``gradwatch serve``: run the server (uvicorn + ``create_app``) on a data directory or a
PostgreSQL database (``--db``).

Exit codes: 0 after a clean stop, 2 for bad arguments (bad port, a port in use or a host
it cannot listen on, unusable data directory or database, a non-loopback address without a
token, an invalid ``--import`` log).
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from gradwatch.cliargs import CommandParser
from gradwatch.server.files import private_dir
from gradwatch.server.settings import (
    Settings,
    default_data_dir,
    default_parse_processes,
    is_loopback,
)

log = logging.getLogger("gradwatch.server")


def _parser() -> CommandParser:
    p = CommandParser(prog="gradwatch serve", description="Start the gradwatch server and "
                                                    "dashboard.")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    p.add_argument("--port", type=int, default=8765, help="port (default 8765)")
    p.add_argument("--data", type=Path, default=None,
                   help="data directory (default $GRADWATCH_DATA or ./gradwatch-data)")
    p.add_argument("--db", default=None, metavar="URL",
                   help="store in this PostgreSQL database, postgresql://USER@HOST:PORT/DB "
                        "(or $GRADWATCH_DB; needs gradwatch[postgres]); default: SQLite "
                        "in --data. Put a password in GRADWATCH_DB or ~/.pgpass, not here: "
                        "arguments show in ps")
    p.add_argument("--token", default=None, help="require this token (or GRADWATCH_TOKEN)")
    p.add_argument("--insecure-no-token", action="store_true",
                   help="allow a non-loopback bind without a token (container behind a "
                        "loopback-only port mapping)")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="LOG",
                   help="store a saved step log as a run before serving (repeatable)")
    p.add_argument("--import-only", action="store_true",
                   help="import the --import logs and exit without serving")
    p.add_argument("--keep-param-norms", nargs=2, metavar=("every", "N"), default=None,
                   help="keep the per-parameter norms of every N-th step of new runs only "
                        "(and of every step with a finding fact, a skipped step or a "
                        "non-finite norm); default: every step")
    d = Settings()
    p.add_argument("--max-frame-bytes", type=int, default=d.max_frame_bytes,
                   help="largest ingest frame (default 1 MiB)")
    p.add_argument("--max-msgs-per-sec", type=float, default=d.max_msgs_per_sec,
                   help="ingest frames per second per client address, over all its "
                        "connections (default %(default)g; bursts of twice that)")
    p.add_argument("--max-ingest-connections", type=int, default=d.max_ingest_connections,
                   help="open ingest connections (default %(default)s)")
    p.add_argument("--ingest-idle-timeout", type=float, default=d.ingest_idle_timeout,
                   help="seconds an ingest connection may send nothing before it is "
                        "closed (default %(default)g; keep it above the probe's 60 s "
                        "keepalive)")
    p.add_argument("--ingest-hello-timeout", type=float, default=d.ingest_hello_timeout,
                   help="seconds a new ingest connection may take to send its first frame "
                        "(default %(default)g)")
    p.add_argument("--max-runs", type=int, default=d.max_runs,
                   help="runs the server holds (default %(default)s)")
    p.add_argument("--max-live-clients", type=int, default=d.max_live_clients,
                   help="open dashboard sockets (default %(default)s)")
    p.add_argument("--live-backlog", type=int, default=d.live_backlog,
                   help="step rows a dashboard socket may fall behind before it is "
                        "dropped (default %(default)s)")
    p.add_argument("--interrupted-after", type=float, default=d.interrupted_after,
                   help="seconds without a stream before a live run reads as interrupted")
    p.add_argument("--send-timeout", type=float, default=d.send_timeout,
                   help="seconds a live client's socket may stay blocked before it is "
                        "dropped (default %(default)g)")
    p.add_argument("--header-timeout", type=float, default=d.header_timeout,
                   help="seconds a client may take to send request headers "
                        "(default %(default)g)")
    p.add_argument("--max-header-bytes", type=int, default=d.max_header_bytes,
                   help="largest request head (default 64 KiB)")
    p.add_argument("--max-import-bytes", type=int, default=d.max_import_bytes,
                   help="largest step log imported, as uploaded and as text once inflated "
                        "(default 512 MiB)")
    p.add_argument("--max-line-bytes", type=int, default=d.max_line_bytes,
                   help="longest line of an imported step log (default 16 MiB)")
    p.add_argument("--keep-alive-timeout", type=float, default=d.keep_alive_timeout,
                   help="seconds an idle keep-alive HTTP connection stays open "
                        "(default %(default)g)")
    p.add_argument("--ping-interval", type=float, default=d.ping_interval,
                   help="seconds between websocket pings (default %(default)g)")
    p.add_argument("--ping-timeout", type=float, default=d.ping_timeout,
                   help="seconds a websocket may take to answer a ping before it is "
                        "dropped (default %(default)g)")
    p.add_argument("--parse-processes", type=int, default=default_parse_processes(),
                   help="worker processes validating ingest frames and imports (0: a "
                        "thread; default: one per core, 2 to 4: %(default)s here)")
    p.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                   help="extra browser origin allowed to open the sockets and send "
                        "writes (repeatable)")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="extra Host name accepted without a token, besides localhost and "
                        "loopback addresses (repeatable; '*': any)")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"],
                   help="the server's log level")
    p.add_argument("--access-log", action="store_true",
                   help="log every HTTP request (off by default, so the server's own lines "
                        "stay readable)")
    return p


def settings_from_args(argv: Sequence[str]) -> tuple[Settings, argparse.Namespace]:
    """Parse and check arguments. Raises SystemExit(2) with a message on bad ones."""
    p = _parser()
    a = p.parse_args(argv)
    if not 0 < a.port < 65536:
        p.error(f"--port {a.port} is not a port number (1-65535)")
    for name in ("max_frame_bytes", "max_runs", "max_live_clients", "max_ingest_connections",
                 "live_backlog", "max_header_bytes", "max_import_bytes", "max_line_bytes"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("max_msgs_per_sec", "ingest_idle_timeout", "ingest_hello_timeout",
                 "send_timeout", "header_timeout",
                 "keep_alive_timeout", "ping_interval", "ping_timeout"):
        if not getattr(a, name) > 0:
            p.error(f"--{name.replace('_', '-')} must be positive")
    if not a.interrupted_after >= 0:
        p.error("--interrupted-after must be 0 or more")
    keep = 1
    if a.keep_param_norms is not None:
        word, n = a.keep_param_norms
        if word != "every" or not n.isdigit() or int(n) < 1:
            p.error("--keep-param-norms takes 'every N' with N a whole number of at least 1")
        keep = int(n)
    token = a.token or os.environ.get("GRADWATCH_TOKEN") or None
    if not is_loopback(a.host) and not token:
        if not a.insecure_no_token:
            p.error(f"binding {a.host} (not loopback) requires --token TOKEN or "
                    f"GRADWATCH_TOKEN; anyone who can reach the port could read and write "
                    f"runs")
        log.warning("!!! serving on %s WITHOUT a token (--insecure-no-token): anyone who can "
                    "reach this port can read, write and delete runs !!!", a.host)
    if "*" in a.allow_host and not token:
        log.warning("--allow-host '*' without a token: any web page whose name resolves to "
                    "this machine can read, write and delete runs (DNS rebinding)")
    data = a.data or default_data_dir()
    url = a.db or os.environ.get("GRADWATCH_DB") or None
    if a.db:
        from gradwatch.server.backend import password_of
        if password_of(a.db):  # masked in every line we write, but ps shows argv as given
            log.warning("the password in --db is visible in ps: put the URL in GRADWATCH_DB "
                        "or the password in ~/.pgpass")
    if url is not None and url.startswith("sqlite://"):
        data, url = Path(url.split("://", 1)[1]), None
    if url is not None:
        from gradwatch.server.backend import UnknownDatabase, open_database
        try:
            open_database(url)
        except UnknownDatabase as e:
            p.error(str(e))
    else:
        try:
            private_dir(data)
            probe = data / ".gradwatch-write-test"
            probe.write_text("ok")
            probe.unlink()
        except OSError as e:
            p.error(f"data directory {data} is not writable: {e.strerror or e}")
    s = Settings(host=a.host, port=a.port, data_dir=data, db=url, token=token,
                 max_frame_bytes=a.max_frame_bytes, max_msgs_per_sec=a.max_msgs_per_sec,
                 max_runs=a.max_runs, max_live_clients=a.max_live_clients,
                 interrupted_after=a.interrupted_after, send_timeout=a.send_timeout,
                 parse_processes=max(0, a.parse_processes),
                 allowed_origins=tuple(a.allow_origin), allowed_hosts=tuple(a.allow_host),
                 max_ingest_connections=a.max_ingest_connections,
                 ingest_idle_timeout=a.ingest_idle_timeout, live_backlog=a.live_backlog,
                 ingest_hello_timeout=a.ingest_hello_timeout,
                 header_timeout=a.header_timeout, max_header_bytes=a.max_header_bytes,
                 keep_alive_timeout=a.keep_alive_timeout, ping_interval=a.ping_interval,
                 ping_timeout=a.ping_timeout, keep_param_norms=keep,
                 max_import_bytes=a.max_import_bytes, max_line_bytes=a.max_line_bytes)
    return s, a


def import_logs(settings: Settings, paths: Sequence[str]) -> int:
    """Store step logs as runs; 0, or 2 after printing why a log is invalid.

    Every log is read through and validated first (a block at a time), so an invalid
    one stores nothing; then each is stored a block at a time.
    """
    from gradwatch.server.batch import batch_of_records
    from gradwatch.server.errors import Refused
    from gradwatch.server.importing import LogBlocks, file_blocks, validate
    from gradwatch.server.storage import Store
    from gradwatch.steplog import special_file

    for path in paths:
        special = special_file(path)
        if special:  # read twice (validated, then stored): a pipe would hang or read empty
            print(f"gradwatch serve: cannot import {path}: it is {special}, not a file",
                  file=sys.stderr)
            return 2
        try:
            with open(path, "rb") as fh:
                for w in validate(path, file_blocks(fh), settings.max_import_bytes,
                                  settings.max_line_bytes):
                    print(f"gradwatch serve: warning: {w}", file=sys.stderr)
        except OSError as e:
            print(f"gradwatch serve: cannot import {path}: cannot open step log: "
                  f"{e.strerror or e}", file=sys.stderr)
            return 2
        except Refused as e:
            print(f"gradwatch serve: cannot import {e.reason}", file=sys.stderr)
            return 2
    store = Store(settings.database(), max_runs=settings.max_runs,
                  keep_param_norms=settings.keep_param_norms)
    store.start()
    try:
        for path in paths:
            blocks = LogBlocks(path, max_bytes=settings.max_import_bytes,
                               max_line=settings.max_line_bytes)
            run_id, n = None, 0
            try:
                with open(path, "rb") as fh:
                    for data in [*file_blocks(fh), None]:
                        recs = blocks.parse(blocks.feed(data) if data is not None
                                            else blocks.finish())
                        if run_id is None and blocks.header is not None:
                            run_id = store.call(store.import_start, blocks.header)
                            recs = recs[1:]
                        if recs and run_id is not None and blocks.header is not None:
                            res = store.call(store.ingest, batch_of_records(
                                run_id, blocks.header.rank, recs))
                            n += len(res.rows)
                if run_id is not None:
                    store.call(store.import_end, run_id)
            except (Refused, OSError) as e:
                if run_id is not None:
                    store.call(store.delete, run_id)
                why = e.reason if isinstance(e, Refused) else str(e)
                print(f"gradwatch serve: cannot import {path}: {why}", file=sys.stderr)
                return 2
            print(f"imported {path} as run {run_id} ({n} steps)")
    finally:
        store.close()
    return 0


def main(argv: Sequence[str]) -> int:
    """Entry point of ``gradwatch serve``."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    settings, a = settings_from_args(argv)
    from gradwatch.server.backend import open_database
    from gradwatch.server.errors import NewerDatabase

    database = open_database(settings.database())
    try:  # the schema is brought up to date (or refused) before anything else
        database.close_writer(database.open_writer())
    except NewerDatabase as e:
        print(f"gradwatch serve: {e}", file=sys.stderr)
        return 2
    except database.Error as e:  # unreachable, or a full disk mid-migration: no change
        print(f"gradwatch serve: cannot open the database {database.where}: {e}",
              file=sys.stderr)
        return 2
    if a.imports:
        rc = import_logs(settings, a.imports)
        if rc or a.import_only:
            return rc
    elif a.import_only:  # never serve when told not to, even with nothing to import
        print("gradwatch serve: --import-only without --import LOG: nothing imported "
              f"(the database {database.where} is ready)", file=sys.stderr)
        return 0
    import uvicorn

    from gradwatch.gcpause import settle_server_heap
    from gradwatch.server.app import create_app
    from gradwatch.server.transport import mask_tokens_in_logs, uvicorn_options

    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    why = listen_problem(settings.host, settings.port)
    if why is not None:
        print(f"gradwatch serve: {why}", file=sys.stderr)
        return 2
    hint = "?token=<your token>" if settings.token else ""
    print(f"gradwatch: dashboard at http://{host}:{settings.port}/{hint}  "
          f"(data in {database.where})", flush=True)
    mask_tokens_in_logs()
    quiet_shutdown()
    app, options = create_app(settings), uvicorn_options(settings)
    settle_server_heap()  # the app and uvicorn's protocols are imported: start-up is done
    try:
        uvicorn.run(app, host=settings.host, port=settings.port, log_level=a.log_level,
                    access_log=a.access_log, **options)
    except OSError as e:
        print(f"gradwatch serve: cannot listen on {host}:{settings.port}: {e}",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # uvicorn stopped gracefully, then re-raised the Ctrl-C
        pass
    print("gradwatch serve: stopped", flush=True)
    return 0


def listen_problem(host: str, port: int) -> str | None:
    """Why a server could not listen on ``host:port`` (a port in use, a name that does not
    resolve, an address not this machine's), as a sentence, or None: found before uvicorn
    starts, so ``serve`` and ``demo`` answer with one line and exit 2, not uvicorn's
    start-up failure (exit 3) or a traceback.

    Tested the way uvicorn binds, through asyncio's ``create_server`` with
    ``SO_REUSEADDR``: connections a server that just stopped left in TIME-WAIT do not stop
    it, a listening socket does (a plain ``bind`` would refuse the port for a minute).
    """
    try:
        addrs = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError) as e:  # UnicodeError: a name IDNA cannot encode
        why = getattr(e, "strerror", None) or e
        return f"--host {host!r} is not an address or a name of this machine ({why})"
    for family, kind, proto, _, addr in addrs:
        with socket.socket(family, kind, proto) as s:
            if os.name != "nt":  # on Windows SO_REUSEADDR would share a listening port
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(addr)
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    return (f"port {port} on {host} is in use (another gradwatch?); pick "
                            f"another with --port")
                return f"cannot listen on {host} port {port}: {e.strerror or e}"
    return None


_SHUTDOWN_LINES = ("Shutting down", "Waiting for application shutdown",
                   "Application shutdown complete", "Finished server process",
                   "Waiting for connections to close", "Waiting for background tasks")


def quiet_shutdown() -> None:
    """Leave out uvicorn's informational lines about stopping: ``gradwatch serve: stopped``
    says it in one (warnings and errors still show)."""

    def keep(record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or not str(record.msg).startswith(
            _SHUTDOWN_LINES)

    logging.getLogger("uvicorn.error").addFilter(keep)
