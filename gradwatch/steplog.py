"""Step logs on disk: a JSON Lines writer for the probe; the strict reader
(:class:`~gradwatch.logreader.LogReader`, exported here too) and whole-log helpers.

A step log is readable while it is being written and after a crash: every complete line is
a record, and only a truncated *last* line (the process died mid-write) is tolerated, as a
warning. Anything else that does not parse is an error naming the line and the field. A log
named ``*.gz`` is written gzip-compressed, and any log that starts with gzip's magic bytes
is read through gzip.
"""

from __future__ import annotations

import gzip
import io
import os
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from pydantic import BaseModel

from gradwatch.logreader import BLOCK as BLOCK
from gradwatch.logreader import GZIP_MAGIC as GZIP_MAGIC
from gradwatch.logreader import LogReader as LogReader
from gradwatch.logreader import StepLogError as StepLogError
from gradwatch.wire import Header
from gradwatch.wirejson import dump_record


@dataclass
class StepLog:
    """The parsed contents of a step log, held whole (see :class:`LogReader` to stream)."""

    header: Header
    records: list[Any]
    """Every record after the header, in file order."""
    warnings: list[str] = field(default_factory=list)
    path: str = ""
    """Where it was read from."""


def is_compressed(path: str | os.PathLike[str]) -> bool:
    """A log at ``path`` is written gzip-compressed (its name ends in ``.gz``)."""
    return str(path).endswith(".gz")


def special_file(path: str | os.PathLike[str]) -> str | None:
    """What ``path`` is when it is a named pipe or a socket (``"a named pipe (FIFO)"``), else
    None: a step log cannot be written there (opening a pipe to write waits for a reader:
    training would hang at its first step)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return None


def log_path_problem(path: str | os.PathLike[str], streamed: bool = False) -> str | None:
    """Why no step log can be written at ``path``, as the words that follow its name in a
    message (``"is a directory; ..."``), or None: ``gradwatch run --log`` and ``watch(log=)``
    say the same. ``streamed``: a server is to get the log, which the streamer tails as it
    grows; it cannot read a compressed one from an offset."""
    if Path(path).is_dir():
        return f"is a directory; give a file path such as {Path(path) / 'run.jsonl'}"
    special = special_file(path)
    if special:  # writing one waits for a reader: the training would hang
        return f"is {special}, not a file; give a file path such as run.jsonl"
    if streamed and is_compressed(path):
        return ("would be compressed (.gz), but a log streamed to a server must be plain: "
                "drop '.gz', or compress it after the run")
    return None


def read_log(path: str | os.PathLike[str] | IO[bytes], name: str | None = None) -> StepLog:
    """Read and validate a whole step log, held in memory (:class:`LogReader` streams).

    Raises:
        StepLogError: see :class:`LogReader`.
    """
    with LogReader(path, name) as reader:
        records = list(reader)
    return StepLog(reader.header, records, reader.warnings, reader.path)


def open_run(paths: Sequence[str | os.PathLike[str]]) -> list[LogReader]:
    """Readers of the step logs of one run's streams: its ranks, and the worker processes
    ``gradwatch run`` watched (``check run.rank*.jsonl``), their headers read and checked
    against each other. A path given twice is read once. The caller closes the readers.

    Raises:
        StepLogError: a log cannot be read (see :class:`LogReader`); the logs are of
            different runs; or two logs are the same stream (rank and worker) of the run.
    """
    readers: dict[str, LogReader] = {}
    try:
        for p in paths:
            real = os.path.realpath(p)
            if real not in readers:
                readers[real] = LogReader(p)
        _one_run(list(readers.values()))
    except BaseException:
        for r in readers.values():
            r.close()
        raise
    return list(readers.values())


def _one_run(logs: Sequence[LogReader | StepLog]) -> None:
    runs: dict[str, list[str]] = {}
    for log in logs:
        runs.setdefault(log.header.run, []).append(log.path)
    if len(runs) > 1:
        listed = "; ".join(f"run '{r}': {', '.join(ps)}" for r, ps in runs.items())
        raise StepLogError(logs[0].path, None,
                           f"these logs are of different runs ({listed}); check one run's "
                           f"logs at a time")
    streams: dict[tuple[int, int | None], str] = {}
    for log in logs:
        h = log.header
        other = streams.setdefault((h.rank, h.worker), log.path)
        if other != log.path:
            who = f"rank {h.rank}" + (f" worker {h.worker}" if h.worker is not None else "")
            raise StepLogError(log.path, None, f"{other} and {log.path} are both {who} of "
                                               f"run '{h.run}': give each stream's log once")


def read_run(paths: Sequence[str | os.PathLike[str]]) -> list[StepLog]:
    """:func:`open_run`, each log read whole (:class:`StepLog`).

    Raises:
        StepLogError: see :func:`open_run`.
    """
    readers = open_run(paths)
    try:
        return [StepLog(r.header, list(r), r.warnings, r.path) for r in readers]
    finally:
        for r in readers:
            r.close()


class StepLogWriter:
    """Appends records to a step log, one JSON line each; a new log is created 0600.

    Lines are written whole (so a reader never sees half of one unless the process dies
    mid-write) and flushed at most ``flush_every`` seconds apart and on :meth:`close`. A
    path ending in ``.gz`` is written gzip-compressed, each flush a sync flush (a reader sees
    every flushed line); a log another process tails (a streamed run's spool) must be plain.
    Not thread-safe: one thread (the probe's writer thread) owns a writer.
    """

    def __init__(self, path: str | os.PathLike[str], flush_every: float = 1.0):
        self.path = Path(path)
        if self.path.parent and not self.path.parent.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
        # 0600: a step log holds host names, command lines and parameter names.
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._raw: IO[bytes] | None = None
        if is_compressed(self.path):
            self._raw = open(fd, "ab")  # noqa: SIM115 - closed by close()
            # Appending to a log adds a gzip member; readers read members one after another.
            gz = gzip.GzipFile(fileobj=self._raw, mode="ab")
            self._fh: IO[str] | None = io.TextIOWrapper(gz, encoding="utf-8",
                                                        write_through=False)
        else:
            self._fh = open(  # noqa: SIM115 - closed by close()
                fd, "a", encoding="utf-8", buffering=1 << 16)
        self._flush_every = flush_every
        self._last_flush = time.monotonic()

    def write(self, record: BaseModel | str) -> None:
        """Append one record (a model, or an already-serialised JSON line)."""
        if self._fh is None:
            raise ValueError(f"step log {self.path} is closed")
        line = record if isinstance(record, str) else dump_record(record)
        self._fh.write(line + "\n")
        now = time.monotonic()
        if now - self._last_flush >= self._flush_every:
            self.flush()

    def flush(self) -> None:
        if self._fh is not None:
            self._fh.flush()
            self._last_flush = time.monotonic()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.flush()
            self._fh.close()
            self._fh = None
        if self._raw is not None:  # gzip leaves the file it wrote to open
            self._raw.close()
            self._raw = None

    def __enter__(self) -> StepLogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def dumps_log(header: Header, records: list[Any]) -> str:
    """A whole step log as one string (for exports and tests)."""
    buf = io.StringIO()
    buf.write(dump_record(header) + "\n")
    for r in records:
        buf.write((r if isinstance(r, str) else dump_record(r)) + "\n")
    return buf.getvalue()

