"""The strict step-log reader: a log record by record, its errors naming ``file:line`` and
the field.

Everyone who reads a log reads it here: ``check``, ``replay``, the server's import, and
:mod:`gradwatch.steplog`'s whole-log helpers. A log is validated at the version its header
names (:func:`gradwatch.wire.parse_record`); one that starts with gzip's magic bytes is read
through gzip.
"""

from __future__ import annotations

import gzip
import os
import stat
import zlib
from collections.abc import Iterator
from typing import IO, Any

from pydantic import ValidationError

from gradwatch.gcpause import gc_paused
from gradwatch.validation import plain_error
from gradwatch.wire import PROTOCOL_VERSION, RECORDS_ADAPTER, Header, parse_record


class StepLogError(ValueError):
    """A step log that cannot be read; the message names the file, line and problem."""

    def __init__(self, path: str | os.PathLike[str], line: int | None, problem: str):
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {problem}")
        self.path = str(path)
        self.line = line
        self.problem = problem


GZIP_MAGIC = b"\x1f\x8b"


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
                raw: IO[bytes] = open_log(source)
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
                self.warnings.append(f"{self.path}: the compressed log ends mid-stream (the "
                                     f"writer stopped); read what came before")
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
            fh = self._owned or self._fh
            if hasattr(fh, "fileno") and stat.S_ISFIFO(os.fstat(fh.fileno()).st_mode):
                raise StepLogError(self.path, None, "nothing to read: a pipe that no process "
                                                    "writes into")
            raise StepLogError(self.path, None, EMPTY)
        return header_of(self.path, *first)

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
        return records_of(self.path, block, self.header.v, self.warnings)

    def close(self) -> None:
        """Close the file the reader opened (a file object given stays open)."""
        if self._owned is not None:
            self._owned.close()
            self._owned = None

    def __enter__(self) -> LogReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


EMPTY = "the step log is empty (no header line)"


def header_of(name: str, line: int, raw: bytes) -> Header:
    """A log's first non-blank line (number ``line``) as its header.

    Raises:
        StepLogError: it is not JSON, not a valid record, or not a header.
    """
    try:
        rec = parse_record(raw, PROTOCOL_VERSION)  # a header reads the same at any version
    except ValidationError as e:
        if not raw.lstrip().startswith(b"{"):
            raise StepLogError(name, line, "not a gradwatch step log (line 1 is not "
                                           "JSON)") from e
        if not any(err["type"] != "union_tag_not_found" for err in e.errors()):
            # JSON lines without the contract's "type" at the top: another tool's log
            raise StepLogError(name, line, "not a gradwatch step log (line 1 is JSON "
                                           "without a 'type' field: another tool's log?)") from e
        raise StepLogError(name, line, plain_error(e)) from e
    if not isinstance(rec, Header):
        raise StepLogError(name, line, f"the first line must be the header, found a "
                                       f"'{rec.type}' record")
    return rec


def records_of(name: str, block: list[tuple[int, bytes]], v: int,
               warnings: list[str]) -> list[tuple[int, Any]]:
    """Numbered lines after the header, each with its newline, validated at version ``v``
    in one call: ``(line, record)`` pairs. A line without its newline can only be the log's
    last, cut short by a writer that stopped: if invalid it is skipped with a warning added
    to ``warnings``.

    Raises:
        StepLogError: an invalid line, or a second header.
    """
    if not block:
        return []
    try:
        with gc_paused():
            records = RECORDS_ADAPTER.validate_json(
                b"[" + b",".join(raw for _, raw in block) + b"]", context={"v": v})
    except ValidationError:
        records = []
    if len(records) != len(block):  # a bad line: find it, one line at a time
        records = [_one(name, line, raw, v, warnings) for line, raw in block]
    out = []
    for (line, _), rec in zip(block, records, strict=True):
        if isinstance(rec, Header):
            raise StepLogError(name, line, "a second header: this file is two logs "
                                           "concatenated; split it into one file per run")
        if rec is not None:
            out.append((line, rec))
    return out


def _one(name: str, line: int, raw: bytes, v: int, warnings: list[str]) -> Any:
    try:
        return parse_record(raw, v)
    except ValidationError as e:
        if raw.endswith(b"\n"):  # only the last line can lack its newline
            raise StepLogError(name, line, plain_error(e)) from e
        warnings.append(f"{name}:{line}: last line is truncated (the writer stopped "
                        f"mid-line); ignored it")
        return None


def open_log(path: str | os.PathLike[str]) -> IO[bytes]:
    """``path`` opened to read bytes; a named pipe no process writes into reads as empty
    at once instead of waiting forever for a writer (``check <(zcat run.jsonl.gz)`` still
    reads its pipe to the end).

    Raises:
        OSError: as ``open`` does (missing, a directory, no permission).
    """
    nonblock = getattr(os, "O_NONBLOCK", 0)  # POSIX: a FIFO's open waits for a writer
    fd = os.open(path, os.O_RDONLY | nonblock | getattr(os, "O_BINARY", 0))
    try:
        if nonblock:
            os.set_blocking(fd, True)  # reads wait for data again, while a writer is there
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


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
