"""The probe's streamer: one thread tails the spool (the step log) and sends it to a server.

The training loop only calls :meth:`Streamer.notify` (sets an event). The streamer thread
owns the websocket: it reads complete lines from the spool (validated with the wire models
at the version the spool's header names, unless this process wrote them: ``trusted``),
sends the lines as they are in
:class:`~gradwatch.wire.IngestBatch` frames of that version (a few in flight) and
advances on the server's acks. When the server is down, records simply stay in the spool;
on reconnect (exponential backoff) it asks the server where to resume (``hello`` →
``resume``) and sends the rest, so nothing is lost or stored twice. Its ``hello`` carries
the stream's key (:mod:`gradwatch.streamkey`), so no other connection can write the stream.
Imports neither torch nor fastapi.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
import socket
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import ValidationError
from websockets.exceptions import (
    ConnectionClosed,
    InvalidHandshake,
    InvalidMessage,
    InvalidStatus,
)
from websockets.sync.client import ClientConnection, connect

from gradwatch.frames import Ack, CloseCode, Hello, Resume
from gradwatch.spool import SpoolReader

log = logging.getLogger(__name__)
# The backoff's jitter has its own generator: this thread runs in the training process, and
# a draw from the global one would change the user's `random` sequence (data order, ...).
_JITTER = random.Random()

WINDOW = 4
"""Batches in flight before waiting for an ack."""
MIN_INTERVAL = 0.01
"""Seconds between two frames that are not full (doubled, up to a second, each time the
server closes the stream for its rate limit)."""
KEEPALIVE = 60.0
"""Seconds without a frame after which an idle stream sends a ``hello`` (the server closes
ingest connections idle for longer than its ``--ingest-idle-timeout``)."""
FATAL_CLOSE = {CloseCode.UNSUPPORTED: "unsupported data", CloseCode.INVALID: "invalid record",
               CloseCode.POLICY: "refused by policy",
               CloseCode.NOT_OWNER: "the stream belongs to another connection"}
"""Close codes after which resending cannot help: the streamer stops (records stay in the
spool)."""


@dataclasses.dataclass(slots=True)
class StreamStats:
    """What a :class:`Streamer` did so far (:meth:`Streamer.stats` returns a copy).

    Also read as a mapping (``stats()["acked_seq"]``, ``stats().get("dropped", 0)``), the
    form earlier releases returned.
    """

    sent: int = 0
    """Records the server stored (acked) from this streamer."""
    dropped: int = 0
    """Spool lines skipped: invalid, or too long for any frame."""
    connected: bool = False
    reconnects: int = 0
    acked_seq: int = -1
    """Every record up to this seq is stored; -1: none yet."""
    server_had: int | None = None
    """The server's last stored seq when the stream first connected; None before."""
    backlog_bytes: int = 0
    """Spool bytes not acked yet (as of :meth:`Streamer.close`)."""
    disabled: str | None = None
    """Why the streamer gave up, if it did (the records stay in the spool)."""
    unreachable: str | None = None
    """Why the last connection attempt failed (``URL: reason``), while none has succeeded
    since; None once connected."""
    refused: CloseCode | None = None
    """The close code of the server's refusal that stopped the streamer, if one did."""

    def __getitem__(self, name: str) -> Any:
        if name not in self.__dataclass_fields__:
            raise KeyError(name)
        return getattr(self, name)

    def get(self, name: str, default: Any = None) -> Any:
        """The field ``name``, or ``default`` if there is no such field (mapping reads)."""
        return getattr(self, name) if name in self.__dataclass_fields__ else default


def reachable(server: str, timeout: float = 3.0) -> str | None:
    """Why none of the servers in ``server`` (one URL, or several comma-separated) can be
    reached (a TCP connection to its host and port fails within ``timeout`` seconds), or
    None when one answers."""
    why = None
    for url in ingest_urls(server):
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "wss" else 80)
        try:
            socket.create_connection((parts.hostname or "127.0.0.1", port), timeout).close()
        except OSError as e:
            why = why or (e.strerror or str(e) or type(e).__name__)
            continue
        return None
    return why


def ingest_urls(server: str) -> list[str]:
    """The ingest URLs of ``ws://A,ws://B``: servers sharing one database, tried in turn
    (:class:`Streamer` moves to the next when one fails).

    Raises:
        ValueError: an empty list, or a URL that is not ws:// or wss://, has no host or
            a port outside 1-65535.
    """
    urls = [ingest_url(u.strip()) for u in server.split(",") if u.strip()]
    if not urls:
        raise ValueError(f"no server URL in {server!r}")
    return urls


def ingest_url(server: str) -> str:
    """``ws://host:port`` (or http://) → ``ws://host:port/ws/ingest``."""
    parts = urlsplit(server)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    if scheme not in ("ws", "wss"):
        raise ValueError(f"server URL must start with ws:// or wss://, got {server!r}")
    if not parts.hostname:
        raise ValueError(f"server URL has no host, e.g. ws://127.0.0.1:8765; got {server!r}")
    try:
        port = parts.port
    except ValueError:  # not a number, or past 65535
        port = 0
    if port == 0:
        raise ValueError(f"server URL's port must be a number from 1 to 65535; got {server!r}")
    path = parts.path if parts.path not in ("", "/") else "/ws/ingest"
    return urlunsplit((scheme, parts.netloc, path, parts.query, ""))


class Streamer:
    """Sends the records of a spool file to ``/ws/ingest`` as they are appended.

    Args:
        url: server URL (``ws://127.0.0.1:8765``; ``/ws/ingest`` is added), or several,
            comma-separated, of servers sharing one database: when the connection to one
            fails the next is tried, and it resumes where the database says.
        spool: the step log the probe writes (read-only here; plain, not compressed).
        run: run id (the header's ``run``).
        rank: process rank.
        token: server token, sent as ``Authorization: Bearer``.
        key: the stream's key (:func:`gradwatch.streamkey.own_key`); ``None``: a keyless
            stream, which any connection may write.
        max_records / max_bytes: batch limits.
        trusted: this process writes the spool from records it made or validated (the
            probe, replay): its lines are sent without being validated again here (the
            server validates them); see :class:`~gradwatch.spool.SpoolReader`.
    """

    def __init__(self, url: str, spool: Path, run: str, rank: int = 0,
                 token: str | None = None, *, key: str | None = None,
                 max_records: int = 1000, max_bytes: int = 512 << 10,
                 ack_timeout: float = 10.0, max_backoff: float = 5.0, trusted: bool = False):
        self.urls = ingest_urls(url)
        self.url = self.urls[0]
        """The server connected to, or tried next."""
        self.spool = Path(spool)
        self.run, self.rank, self.token, self.key = run, rank, token, key
        self._reader = SpoolReader(self.spool, run, rank, max_records, max_bytes,
                                   trusted=trusted)
        self.ack_timeout, self.max_backoff = ack_timeout, max_backoff
        self._wake = threading.Event()
        self._stopping = False
        self._deadline = float("inf")
        self._thread: threading.Thread | None = None
        self._ws: ClientConnection | None = None
        self._acked_off = 0  # every line before this byte is stored by the server
        self._acked_seq = -1
        self._inflight: deque[tuple[int, int, int]] = deque()  # (last seq, end off, n)
        self._last_send = 0.0
        self._last_full = False
        self._unreachable_said = False
        """The current outage was reported (once per outage, at its first failure)."""
        self.min_interval = MIN_INTERVAL
        self._stats = StreamStats()
        self._hello_unanswered = False
        """A hello was sent on this connection and its resume has not come yet."""

    # -- API for the probe (any thread) -------------------------------------------------
    def start(self) -> None:
        """Start the sender thread (returns at once)."""
        self._thread = threading.Thread(target=self._main, name="gradwatch-streamer",
                                        daemon=True)
        self._thread.start()

    def notify(self) -> None:
        """New lines were flushed to the spool (cheap; never blocks)."""
        self._wake.set()

    def close(self, timeout: float = 5.0) -> None:
        """Send what is left within ``timeout`` seconds, then stop.

        Whatever could not be sent stays in the spool (replayable with ``gradwatch
        replay``).
        """
        self._deadline = time.monotonic() + timeout
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout + 1.0)
            if self._thread.is_alive():
                ws = self._ws
                if ws is not None:
                    ws.close()
                self._thread.join(2.0)
        self._update_backlog()

    def stats(self) -> StreamStats:
        """A copy of what the streamer did so far (:class:`StreamStats`)."""
        return dataclasses.replace(self._stats, dropped=self._reader.dropped)

    # -- the thread ---------------------------------------------------------------------
    def _main(self) -> None:
        failures = 0
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else None
        while not (self._stopping and time.monotonic() >= self._deadline):
            try:
                with connect(self.url, open_timeout=3.0, close_timeout=1.0,
                             compression=None, additional_headers=headers,
                             max_size=1 << 20) as ws:
                    self._ws = ws
                    self._handshake(ws)
                    failures = 0
                    while not self._pump(ws):
                        pass
                    return
            except (ConnectionClosed, OSError, TimeoutError, InvalidHandshake,
                    ValidationError) as e:
                failures += 1
                self._lost(e)
                self._next_server()
            except Exception:  # an internal error: log once, stop streaming
                log.exception("gradwatch streamer failed; records stay in %s", self.spool)
                self._stats.disabled = "internal error (see log)"
                return
            finally:
                self._ws = None
                self._stats.connected = False
            delay = min(self.max_backoff, 0.1 * 2 ** min(failures, 10))
            delay *= 0.75 + _JITTER.random() / 2
            if self._stopping:
                delay = min(delay, max(0.0, self._deadline - time.monotonic()))
            self._wake.wait(delay)
            self._wake.clear()

    def _next_server(self) -> None:
        """Fail over: the next URL of the list (servers sharing one database resume the
        stream where it stands there)."""
        if len(self.urls) > 1:
            self.url = self.urls[(self.urls.index(self.url) + 1) % len(self.urls)]
            log.info("gradwatch streamer: trying %s next", self.url)

    def _handshake(self, ws: ClientConnection) -> None:
        """Ask where to resume (``hello`` → ``resume``) and position the spool reader."""
        ws.send(Hello(run=self.run, rank=self.rank, key=self.key)
                .model_dump_json(exclude_none=True))
        self._hello_unanswered = True
        resume = Resume.model_validate_json(ws.recv(timeout=self.ack_timeout))
        self._hello_unanswered = False
        if self._unreachable_said:
            log.warning("gradwatch: the server at %s is reachable again; sending the "
                        "records it lacks", self.url)
            self._unreachable_said = False
        elif self._stats.reconnects == 0 and not self._stats.connected:
            log.info("gradwatch streamer: connected to %s", self.url)
        self._stats.connected = True
        self._stats.unreachable = None
        if self._stats.server_had is None:
            self._stats.server_had = resume.seq
        self._inflight.clear()
        # The server may know more than we saw acked (acks lost with the connection), or
        # less (a fresh data directory): then start over from the top of the spool.
        if resume.seq < self._acked_seq:
            self._acked_off = 0
        self._reader.seek(self._acked_off, resume.seq)
        self._acked_seq = self._stats.acked_seq = resume.seq

    def _lost(self, e: BaseException) -> None:
        code = getattr(getattr(e, "rcvd", None), "code", None)
        reason = getattr(getattr(e, "rcvd", None), "reason", "")
        was_connected = self._stats.connected
        answered_hello, self._hello_unanswered = self._hello_unanswered, False
        if code == CloseCode.INVALID and self.key is not None and answered_hello:
            # Our hello is valid to any server that knows stream keys (the key is checked
            # where it is made or read), so one refused in answer is from a server older
            # than keys: stream keyless there, as before keys existed.
            log.warning("gradwatch streamer: %s predates stream keys; the stream is open "
                        "to any writer there (upgrade the server)", self.url)
            self.key = None
        elif code in FATAL_CLOSE:
            refused = CloseCode(code)
            self._stats.refused = refused
            self._stats.disabled = f"server closed {int(refused)} ({reason})"
            log.error("gradwatch streamer: the server refused the stream (%s %s: %s); "
                      "records stay in %s", int(refused), FATAL_CLOSE[refused], reason,
                      self.spool)
            self._stopping, self._deadline = True, 0.0
        elif code == CloseCode.TOO_BIG:
            r = self._reader
            r.max_bytes, r.max_records = max(4096, r.max_bytes // 2), max(1, r.max_records // 2)
        elif code == CloseCode.TRY_LATER:  # fewer, fuller frames (other streams share the budget)
            self.min_interval = min(1.0, self.min_interval * 2)
            log.info("gradwatch streamer: the server closed the stream for now (%s); "
                     "sending at most every %.2f s", reason, self.min_interval)
            if not was_connected and not self._unreachable_said and not self._stopping:
                # Refused on connecting (too many connections, its storage busy): said
                # once per outage, like an unreachable server; the records wait in the spool.
                self._unreachable_said = True
                log.warning("gradwatch: the server at %s refused the stream for now (%s); "
                            "training goes on, every record stays in %s and is sent when "
                            "it takes them (or later: gradwatch replay --resume)",
                            self.url, reason, self.spool)
        else:
            log.debug("gradwatch streamer: no connection to %s: %s", self.url, e)
            self._stats.unreachable = f"{self.url}: {_why(e)}"
            if not self._unreachable_said and not self._stopping:
                # Said at once (a refused connection fails at once, a silent host within
                # the 3 s open timeout), and once per outage: training goes on meanwhile.
                self._unreachable_said = True
                log.warning("gradwatch: cannot reach the server at %s (%s); training goes "
                            "on, every record stays in %s and is sent when the server is "
                            "back", self.url, _why(e), self.spool)
        if was_connected:
            self._stats.reconnects += 1

    def _pump(self, ws: ClientConnection) -> bool:
        """Send up to WINDOW batches, then take one ack. True when done (closing)."""
        while len(self._inflight) < WINDOW:
            # A trickle of lines (a flush per step) is sent at most every MIN_INTERVAL, so
            # a fast loop makes fewer, fuller frames and stays under the server's rate limit.
            wait = self._last_send + self.min_interval - time.monotonic()
            if wait > 0 and not self._last_full:
                if self._inflight:
                    break  # take an ack meanwhile
                time.sleep(wait)
            batch = self._read_batch()
            if batch is None:
                break
            ws.send(batch)
            self._last_send = time.monotonic()
        if self._inflight:
            # One ack per stored batch, in frame order: it says this batch is stored. Its
            # seq is the stream's contiguous prefix, which a line this reader skipped (a
            # gap the server never fills) holds back for good.
            ack = Ack.model_validate_json(ws.recv(timeout=self.ack_timeout))
            _, off, n = self._inflight.popleft()
            self._acked_off = off
            self._stats.sent += n
            self._acked_seq = max(self._acked_seq, ack.seq)
            self._stats.acked_seq = self._acked_seq
            return False
        if self._stopping:
            return True  # everything in the spool is stored
        if time.monotonic() - self._last_send >= KEEPALIVE:
            self._handshake(ws)  # an idle stream says it is alive (and where it stands)
            self._last_send = time.monotonic()
        self._wake.wait(0.5)
        self._wake.clear()
        return False

    def _read_batch(self) -> str | None:
        """The next frame of complete, valid, not-yet-stored lines, or ``None``."""
        while (piece := self._reader.read()) is not None:
            if piece.text is not None:
                self._last_full = piece.full  # more lines waiting: no need to pace the next
                self._inflight.append((piece.last_seq, piece.end, piece.records))
                return piece.text
            if not self._inflight:  # only lines the server already had: count them acked
                self._acked_off = max(self._acked_off, piece.end)
        return None

    def _update_backlog(self) -> None:
        with contextlib.suppress(OSError):
            self._stats.backlog_bytes = max(0, self.spool.stat().st_size - self._acked_off)


def _why(e: BaseException) -> str:
    """A connection failure in a few words."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    status = getattr(getattr(e, "response", None), "status_code", None)
    if isinstance(e, InvalidMessage) or (isinstance(e, InvalidStatus)
                                         and status not in (401, 403, 429, 503)):
        # something answers there, but not as a gradwatch server's ingest socket does
        return f"{e}: is a gradwatch server listening there?"
    return str(e) or type(e).__name__
