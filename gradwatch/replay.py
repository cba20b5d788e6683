"""``gradwatch replay LOG``: send a saved step log into a server as a new run, or the rest
of it into its own run (``--resume``).

The log is read twice, record by record, never held whole: a validating pass with the
strict reader (exit 2 on an invalid log), then the sending pass. By default it is given a
fresh run id and re-timed so it shows as live: at its recorded pace times ``--speed``, or as
fast as possible with ``--fast``; records are written to a temporary spool. With
``--resume`` the log itself is the spool, under its own run id and times: the server says
which records it already holds (``hello`` → ``resume``) and gets the rest, which is how a
run whose server went away is completed (a compressed log is first copied out plain: the
streamer tails a plain file); it proves the run's stream is its own with the key the probe
kept beside the log (``<log>.key``, :mod:`gradwatch.streamkey`). Either way the probe's
:class:`~gradwatch.stream.Streamer` sends (resume on reconnect, nothing stored twice).
Exit codes: 0 sent, 1 the server did not take it all, 2 bad arguments or invalid log.
"""

from __future__ import annotations

import contextlib
import gzip
import math
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gradwatch.cliargs import CommandParser, summary
from gradwatch.frames import CloseCode
from gradwatch.steplog import GZIP_MAGIC, LogReader, StepLogError, StepLogWriter
from gradwatch.stream import Streamer, StreamStats, ingest_urls, reachable
from gradwatch.streamkey import UnsafeKeyFile, key_file, new_key, read_key


def _parser() -> CommandParser:
    p = CommandParser(prog="gradwatch replay", description=summary(__doc__))
    p.add_argument("log", help="a step log written by gradwatch")
    p.add_argument("--server", default="ws://127.0.0.1:8765", help="server URL")
    pace = p.add_mutually_exclusive_group()
    pace.add_argument("--speed", type=float, default=None,
                      help="replay at the recorded pace times X (default 1)")
    pace.add_argument("--fast", action="store_true", help="send as fast as possible")
    pace.add_argument("--resume", action="store_true",
                      help="send what the server lacks into the log's own run (same run "
                           "id), e.g. after the server was unreachable at the end of a run")
    p.add_argument("--name", default=None,
                   help="run name (default: '<name> (replay HH:MM:SS)', the time it starts)")
    p.add_argument("--token", default=None, help="server token (or GRADWATCH_TOKEN)")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds to wait for the server to take the rest at the end")
    return p


def new_run_id(run: str) -> str:
    """A fresh run id derived from the log's (so a replay never merges into the original)."""
    return f"{run[:40]}-replay-{secrets.token_hex(4)}"


def replay_name(name: str, when: time.struct_time) -> str:
    """The default name of a replay: the log's name and the time the replay started, so
    two replays of one log read apart in the run list (the server also keeps names
    distinct, adding " (2)" to a name already taken)."""
    return f"{name} (replay {time.strftime('%H:%M:%S', when)})"


def dashboard_url(server: str, run: str) -> str:
    """The dashboard page of ``run`` on the server at ``server`` (a ws:// or http:// URL)."""
    parts = urlsplit(server)
    scheme = "https" if parts.scheme in ("wss", "https") else "http"
    return f"{scheme}://{parts.netloc}/?run={run}"


def retimed(records: Iterable[Any], t0: float, start: float, speed: float | None,
            run: str, name: str) -> Iterator[tuple[float, Any]]:
    """``(send_at, record)`` pairs with times shifted so the run reads as live now, one
    record at a time.

    ``speed=None`` (``--fast``) keeps the recorded spacing and sends everything at once.
    """
    for r in records:
        offset = (r.t - t0) / speed if speed else r.t - t0
        update: dict[str, Any] = {"t": start + offset}
        if r.type == "header":
            update.update(run=run, run_name=name, started=start + (r.started - t0) /
                          (speed or 1.0))
        yield start + offset if speed else start, r.model_copy(update=update)


def validating_pass(path: str) -> tuple[Any, int, int, list[str]]:
    """The validating pass: ``(header, records, last seq, warnings)``.

    Raises:
        StepLogError: the log is not a valid step log.
    """
    with LogReader(path) as reader:
        n, last = 1, reader.header.seq
        for rec in reader:
            n, last = n + 1, rec.seq
        return reader.header, n, last, reader.warnings


def main(argv: Sequence[str]) -> int:
    """Entry point of ``gradwatch replay``."""
    parser = _parser()
    a = parser.parse_args(argv)
    # argument errors first, then the file, then the server
    if a.speed is not None and not 0 < a.speed < math.inf:  # nan fails both
        parser.error(f"--speed must be a positive number; got {a.speed}")
    if not 0 <= a.timeout < math.inf:
        parser.error(f"--timeout must be 0 or more seconds; got {a.timeout}")
    if a.resume and a.name:
        parser.error("--resume keeps the run as it is; drop --name")
    try:
        ingest_urls(a.server)
    except ValueError as e:
        parser.error(f"--server: {e}")
    try:
        header, n, last_seq, warnings = validating_pass(a.log)
    except StepLogError as e:
        print(f"gradwatch replay: {e}", file=sys.stderr)
        return 2
    why = reachable(a.server)
    if why is not None:
        print(f"gradwatch replay: cannot reach the server at {a.server} ({why}); is "
              f"'gradwatch serve' running there? Nothing was sent.", file=sys.stderr)
        return 1
    for w in warnings:
        print(f"gradwatch replay: warning: {w}", file=sys.stderr)
    token = a.token or os.environ.get("GRADWATCH_TOKEN") or None
    if a.resume:
        return resume(Path(a.log), header.run, header.rank, last_seq, a.server, token,
                      a.timeout)
    run = new_run_id(header.run)
    name = a.name or replay_name(header.run_name or header.run, time.localtime())
    start = time.time()
    print(f"replaying {a.log} ({n} records) as run {run}\n"
          f"dashboard: {dashboard_url(a.server, run)}", flush=True)
    with tempfile.TemporaryDirectory(prefix="gradwatch-replay-") as d, \
            LogReader(a.log) as reader:
        spool = Path(d) / "spool.jsonl"
        writer = StepLogWriter(spool, flush_every=0.05)
        # trusted: written here from the records the validating pass read
        streamer = Streamer(a.server, spool, run, header.rank, token, key=new_key(),
                            trusted=True)
        streamer.start()
        plan = retimed(chain([reader.header], reader), header.t, start,
                       None if a.fast else a.speed or 1.0, run, name)
        try:
            for send_at, rec in plan:
                delay = send_at - time.time()
                if delay > 0.02:
                    writer.flush()
                    streamer.notify()
                    time.sleep(delay)
                writer.write(rec)
            writer.flush()
            streamer.notify()
        except KeyboardInterrupt:
            print("gradwatch replay: interrupted; sending what was written", file=sys.stderr)
        finally:
            writer.close()
            streamer.close(timeout=a.timeout)
        stats = streamer.stats()
    if stats.disabled or stats.acked_seq < last_seq:
        why = _unsent_why(stats)
        print(f"gradwatch replay: sent {stats.sent} of {n} records: {why}", file=sys.stderr)
        return 1
    print(f"sent {stats.sent} records as run {run}")
    return 0


def _unsent_why(stats: StreamStats) -> str:
    """Why a replay left records unacked, in a few words."""
    if stats.disabled:
        return stats.disabled
    if stats.unreachable:
        return f"no connection ({stats.unreachable})"
    return "the server did not ack in time"


def resume(path: Path, run: str, rank: int, last_seq: int, server: str, token: str | None,
           timeout: float) -> int:
    """Send the records of the step log ``path`` the server lacks into run ``run``.

    Returns the exit code: 0 once the server holds every record up to ``last_seq``.
    """
    print(f"resuming run {run} (rank {rank}) from {path}\n"
          f"dashboard: {dashboard_url(server, run)}", flush=True)
    try:
        key = read_key(path)
    except UnsafeKeyFile as e:
        print(f"gradwatch replay: not using the stream key: {e}; make it yours "
              f"(chmod 600, same owner) or remove it", file=sys.stderr)
        key = None
    with tempfile.TemporaryDirectory(prefix="gradwatch-resume-") as d:
        spool = path
        with path.open("rb") as fh:
            if fh.read(2) == GZIP_MAGIC:  # the streamer tails a plain file
                spool = Path(d) / "spool.jsonl"
                with gzip.open(path, "rb") as src, spool.open("wb") as out, \
                        contextlib.suppress(EOFError):  # a writer that died mid-stream
                    shutil.copyfileobj(src, out)
        # trusted: the log the validating pass read (or a plain copy of it)
        streamer = Streamer(server, spool, run, rank, token, key=key, trusted=True)
        streamer.start()
        streamer.notify()
        streamer.close(timeout=timeout)  # returns once the log is stored, or at the timeout
    stats = streamer.stats()
    had = stats.server_had
    if stats.disabled or stats.acked_seq < last_seq:
        why = _unsent_why(stats)
        if key is None and stats.refused == CloseCode.NOT_OWNER:
            why += (f"; the probe that wrote the log kept the stream's key in "
                    f"{key_file(path)}: put it back beside the log")
        print(f"gradwatch replay: the server holds records up to seq {stats.acked_seq} of "
              f"{last_seq}: {why}", file=sys.stderr)
        return 1
    print(f"run {run}: the server had {had + 1 if had is not None else 0} records, "
          f"sent {stats.sent}; it now holds all {last_seq + 1}")
    return 0
