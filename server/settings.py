"""Server settings: one frozen dataclass handed to ``create_app``; no globals."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path


def default_data_dir() -> Path:
    """``$GRADWATCH_DATA`` or ``./gradwatch-data``."""
    return Path(os.environ.get("GRADWATCH_DATA") or "gradwatch-data")


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Settings:
    """Everything the app needs to know; defaults are the safe local ones.

    Attributes:
        data_dir: directory of the SQLite database.
        db: a ``postgresql://USER@HOST:PORT/DB`` URL to store in instead (``--db``,
            ``GRADWATCH_DB``); None: SQLite in ``data_dir``.
        token: when set, every route but ``/healthz`` and static files requires it.
        max_frame_bytes: largest websocket frame accepted on ingest (close 1009 above).
        max_msgs_per_sec: sustained ingest frames per client address, over all its
            connections (close 1013 above); bursts up to twice that are allowed.
        max_ingest_connections: concurrent ``/ws/ingest`` connections (close 1013 above).
        ingest_idle_timeout: seconds an ingest connection may send nothing before it is
            closed (1001); the probe's streamer sends a ``hello`` every minute when idle.
        ingest_hello_timeout: seconds a new ingest connection may take to send its first
            frame (1001 after); the probe sends its ``hello`` at once.
        max_runs: runs the server will hold (new ones refused beyond).
        max_live_clients: concurrent ``/ws/live`` clients.
        live_backlog: step rows a live client may fall behind (past its queue) before it
            is dropped (1013); the dashboard reconnects and starts from a fresh snapshot.
        max_import_bytes: largest step log accepted by ``POST /api/runs/import`` and
            ``serve --import``, counted as uploaded and again as text once inflated (413).
        max_line_bytes: longest line of an imported step log (413).
        keep_param_norms: keep the per-parameter norms of every N-th step of new runs (and
            of every step a plot must keep); 1: every step.
        interrupted_after: seconds after an ingest connection drops without End before
            its run reads as interrupted.
        live_queue: frames queued per live client before its steps get decimated.
        send_timeout: seconds a live client's socket may stay blocked before it is dropped.
        summary_interval: least seconds between two run-list updates of one run.
        allowed_origins: extra browser origins allowed to open the websockets and to send
            writes (besides the server's own).
        allowed_hosts: extra ``Host`` names accepted without a token (besides localhost,
            loopback addresses and a non-wildcard bind address); ``"*"``: any.
        header_timeout: seconds a client may take to send a request's headers.
        max_header_bytes: largest request head (request line and headers) accepted (431).
        keep_alive_timeout: seconds an idle keep-alive HTTP connection stays open.
        ping_interval: seconds between the server's websocket pings.
        ping_timeout: seconds a websocket may take to answer a ping before it is dropped
            (a client that reads nothing never answers).
        parse_processes: worker processes validating ingest frames (0: one thread;
            ``gradwatch serve`` uses :func:`default_parse_processes`).
    """

    host: str = "127.0.0.1"
    port: int = 8765
    data_dir: Path = field(default_factory=default_data_dir)
    db: str | None = None
    token: str | None = None
    max_frame_bytes: int = 1 << 20
    max_msgs_per_sec: float = 200.0
    max_ingest_connections: int = 256
    ingest_idle_timeout: float = 300.0
    ingest_hello_timeout: float = 5.0
    max_runs: int = 1000
    max_live_clients: int = 200
    live_backlog: int = 100_000
    max_import_bytes: int = 512 << 20
    max_line_bytes: int = 16 << 20
    keep_param_norms: int = 1
    interrupted_after: float = 10.0
    live_queue: int = 256
    send_timeout: float = 10.0
    summary_interval: float = 0.25
    allowed_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    header_timeout: float = 10.0
    max_header_bytes: int = 64 << 10
    keep_alive_timeout: float = 5.0
    ping_interval: float = 20.0
    ping_timeout: float = 20.0
    parse_processes: int = 0


    def database(self) -> Path | str:
        """Where runs are stored: the ``db`` URL, else the data directory."""
        return self.db if self.db is not None else self.data_dir

    def __repr__(self) -> str:  # settings get logged: never the token or a DB password
        from gradwatch.server.backend import masked
        return (f"Settings(host={self.host!r}, port={self.port}, data_dir={self.data_dir!r}, "
                f"db={None if self.db is None else masked(self.db)!r}, "
                f"token={'***' if self.token else None})")


def default_parse_processes() -> int:
    """``gradwatch serve``'s parser processes: one per core, two to four. Validation is the
    costliest part of ingest and import, and the server process needs far less than a core
    of its own, so even a 2-core machine imports faster with two (``bench/storage_server.py``).
    Idle parsers only sleep."""
    return max(2, min(4, os.cpu_count() or 2))
