"""Step logs on disk: a JSON Lines writer for the probe and a strict reader for everyone.

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
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from pydantic import BaseModel, ValidationError

from gradwatch.wire import (
    PROTOCOL_VERSION,
    RECORDS_ADAPTER,
    Header,
    dump_record,
    parse_record,
)


class StepLogError(ValueError):
    """A step log that cannot be read; the message names the file, line and problem."""

    def __init__(self, path: str | os.PathLike[str], line: int | None, problem: str):
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {problem}")
        self.path = str(path)
        self.line = line
        self.problem = problem


@dataclass
class StepLog:
    """The parsed contents of a step log, held whole (see :class:`LogReader` to stream)."""

    header: Header
    records: list[Any]
    """Every record after the header, in file order."""
    warnings: list[str] = field(default_factory=list)
    path: str = ""
    """Where it was read from."""


def _describe(err: ValidationError) -> str:
    first = err.errors()[0]
    loc = ".".join(str(x) for x in first.get("loc", ()))
    msg = first.get("msg", "invalid")
    return f"{msg} (at {loc})" if loc else msg


GZIP_MAGIC = b"\x1f\x8b"


def is_compressed(path: str | os.PathLike[str]) -> bool:
    """A log at ``path`` is written gzip-compressed (its name ends in ``.gz``)."""
    return str(path).endswith(".gz")
BLOCK = 512
"""Lines validated per call (one pydantic call over a block costs less than one a line)."""


class LogReader:
    """A step log read record by record: memory does not grow with its length.

    The header is read when the reader is made (:attr:`header`); iterating yields every
    record after it, in file order, each validated at the header's version ``v``. A log
    starting with gzip's magic bytes is read through gzip. Only a truncated *last* line
    (the writer died mid-line, or a compressed log's tail not flushed yet) is tolerated,
    as a warning in :attr:`warnings`.

    Args:
        source: a path, or a binary file object (an upload; the reader does not close it).
        name: what errors and warnings call the log (default: the path).

    Raises:
        StepLogError: (here and while iterating) the file is missing, empty, has no header
            first or a second header, or holds a line that is not a valid record; the
            message names ``file:line`` and the field.
    """

    def __init__(self, source: str | os.PathLike[str] | IO[bytes], name: str | None = None):
        self.path = name if name is not None else str(source)
        self.warnings: list[str] = []
        self._owned: IO[bytes] | None = None
        if isinstance(source, str | os.PathLike):
            try:
                raw: IO[bytes] = Path(source).open("rb")  # noqa: SIM115 - closed by close()
            except OSError as e:
                raise StepLogError(self.path, None,
                                   f"cannot open step log: {e.strerror or e}") from e
            self._owned = raw
        else:
            raw = source
        self._fh = _maybe_gzip(raw)
        self._lineno = 0
        self._started = False
        try:
            self.header: Header = self._read_header()
        except BaseException:
            self.close()
            raise

    def _lines(self) -> Iterator[tuple[int, bytes]]:
        """``(line number, line)`` for each non-blank line left; a last line without its
        newline ends in none."""
        while True:
            try:
                raw = self._fh.readline()
            except EOFError:  # a gzip stream still being written ends mid-member
                return
            except (OSError, zlib.error) as e:
                raise StepLogError(self.path, self._lineno + 1,
                                   f"cannot read the step log: {e}") from e
            if not raw:
                return
            self._lineno += 1
            if raw.strip():
                yield self._lineno, raw

    def _read_header(self) -> Header:
        first = next(self._lines(), None)
        if first is None:
            raise StepLogError(self.path, None, "the step log is empty (no header line)")
        line, raw = first
        try:
            rec = parse_record(raw, PROTOCOL_VERSION)
        except ValidationError as e:
            if not raw.lstrip().startswith(b"{"):
                raise StepLogError(self.path, line, "not a gradwatch step log (line 1 is "
                                                    "not JSON)") from e
            raise StepLogError(self.path, line, _describe(e)) from e
        if not isinstance(rec, Header):
            raise StepLogError(self.path, line, f"the first line must be the header, found "
                                                f"a '{rec.type}' record")
        return rec

    def __iter__(self) -> Iterator[Any]:
        return (rec for _, rec in self.numbered())

    @property
    def records(self) -> Iterator[Any]:
        """The records after the header (one pass: a second iteration yields nothing)."""
        return iter(self)

    def numbered(self) -> Iterator[tuple[int, Any]]:
        """``(line number, record)`` for each record after the header (one pass)."""
        if self._started:
            return
        self._started = True
        block: list[tuple[int, bytes]] = []
        for line, raw in self._lines():
            block.append((line, raw))
            if len(block) >= BLOCK:
                yield from self._validated(block)
                block = []
        yield from self._validated(block)

    def _validated(self, block: list[tuple[int, bytes]]) -> list[tuple[int, Any]]:
        if not block:
            return []
        v = self.header.v
        try:
            records = RECORDS_ADAPTER.validate_json(
                b"[" + b",".join(raw for _, raw in block) + b"]", context={"v": v})
        except ValidationError:
            records = []
        if len(records) != len(block):  # a bad line: find it, one line at a time
            records = [self._one(line, raw, v) for line, raw in block]
        out = []
        for (line, _), rec in zip(block, records, strict=True):
            if isinstance(rec, Header):
                raise StepLogError(self.path, line, "a second header: this file is two logs "
                                                    "concatenated; split it into one file "
                                                    "per run")
            if rec is not None:
                out.append((line, rec))
        return out

    def _one(self, line: int, raw: bytes, v: int) -> Any:
        try:
            return parse_record(raw, v)
        except ValidationError as e:
            if raw.endswith(b"\n"):  # only the last line can lack its newline
                raise StepLogError(self.path, line, _describe(e)) from e
            self.warnings.append(f"{self.path}:{line}: last line is truncated (the writer "
                                 f"stopped mid-line); ignored it")
            return None

    def close(self) -> None:
        """Close the file the reader opened (a file object given stays open)."""
        if self._owned is not None:
            self._owned.close()
            self._owned = None

    def __enter__(self) -> LogReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _maybe_gzip(raw: IO[bytes]) -> IO[bytes]:
    """``raw``, or a gzip reader over it when it starts with gzip's magic bytes."""
    peek = getattr(raw, "peek", None)
    if peek is not None:
        magic = peek(2)[:2]
    else:  # a file object without peek (an upload): read two bytes and put them back
        start = raw.tell()
        magic = raw.read(2)
        raw.seek(start)
    if magic == GZIP_MAGIC:
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    return raw


def iter_lines(path: str | os.PathLike[str]) -> Iterator[tuple[int, Any]]:
    """Yield ``(line_number, record)`` for the header and each record of a step log.

    Kept for callers of the first reader; :class:`LogReader` is the reader.

    Raises:
        StepLogError: see :class:`LogReader`.
    """
    with LogReader(path) as reader:
        yield 1, reader.header
        yield from reader.numbered()


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
    Not thread-safe: one thread (the probe's sender) owns a writer.
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

