"""Step logs on disk: a JSON Lines writer for the probe and a strict reader for everyone.

A step log is readable while it is being written and after a crash: every complete line is
a record, and only a truncated *last* line (the process died mid-write) is tolerated, as a
warning. Anything else that does not parse is an error naming the line and the field.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from pydantic import BaseModel, ValidationError

from gradwatch.wire import Header, dump_record, parse_record


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
    """The parsed contents of a step log."""

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


def iter_lines(path: str | os.PathLike[str]) -> Iterator[tuple[int, Any]]:
    """Yield ``(line_number, record)`` for each record of a step log.

    Raises:
        StepLogError: the file is missing, empty, has no header first, or holds a line
            (other than a truncated last one) that is not a valid record.
    """
    p = Path(path)
    try:
        fh = p.open("rb")
    except OSError as e:
        raise StepLogError(path, None, f"cannot open step log: {e.strerror or e}") from e
    with fh:
        data = fh.read()
    if not data.strip():
        raise StepLogError(path, None, "the step log is empty (no header line)")
    lines = data.split(b"\n")
    last_complete = data.endswith(b"\n")
    n = len(lines)
    for i, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        truncated_tail = i == n and not last_complete
        try:
            rec = parse_record(raw)
        except ValidationError as e:
            if truncated_tail:
                yield i, _Truncated(i, _describe(e))
                return
            if i == 1 and not raw.lstrip().startswith(b"{"):
                raise StepLogError(path, i, "not a gradwatch step log (line 1 is not "
                                            "JSON)") from e
            raise StepLogError(path, i, _describe(e)) from e
        if i == 1 and not isinstance(rec, Header):
            raise StepLogError(path, i, f"the first line must be the header, found a "
                                        f"'{rec.type}' record")
        if i > 1 and isinstance(rec, Header):
            raise StepLogError(path, i, "a second header: this file is two logs "
                                        "concatenated; split it into one file per run")
        yield i, rec


class _Truncated:
    def __init__(self, line: int, problem: str):
        self.line = line
        self.problem = problem


def read_log(path: str | os.PathLike[str]) -> StepLog:
    """Read and validate a whole step log.

    Raises:
        StepLogError: see :func:`iter_lines`.
    """
    header: Header | None = None
    records: list[Any] = []
    warnings: list[str] = []
    for line, rec in iter_lines(path):
        if isinstance(rec, _Truncated):
            warnings.append(f"{path}:{line}: last line is truncated (the writer stopped "
                            f"mid-line); ignored it")
        elif isinstance(rec, Header):
            header = rec
        else:
            records.append(rec)
    if header is None:  # pragma: no cover - iter_lines guarantees a header first
        raise StepLogError(path, 1, "no header line")
    return StepLog(header, records, warnings, str(path))


def read_run(paths: Sequence[str | os.PathLike[str]]) -> list[StepLog]:
    """Read the step logs of one run's streams: its ranks, and the worker processes
    ``gradwatch run`` watched (``check run.rank*.jsonl``). A path given twice is read once.

    Raises:
        StepLogError: a log cannot be read (see :func:`iter_lines`); the logs are of
            different runs; or two logs are the same stream (rank and worker) of the run.
    """
    read: dict[str, tuple[str, StepLog]] = {}
    for p in paths:
        real = os.path.realpath(p)
        if real not in read:
            read[real] = (str(p), read_log(p))
    runs: dict[str, list[str]] = {}
    for path, log in read.values():
        runs.setdefault(log.header.run, []).append(path)
    if len(runs) > 1:
        listed = "; ".join(f"run '{r}': {', '.join(ps)}" for r, ps in runs.items())
        raise StepLogError(next(iter(read.values()))[0], None,
                           f"these logs are of different runs ({listed}); check one run's "
                           f"logs at a time")
    streams: dict[tuple[int, int | None], str] = {}
    for path, log in read.values():
        h = log.header
        other = streams.setdefault((h.rank, h.worker), path)
        if other != path:
            who = f"rank {h.rank}" + (f" worker {h.worker}" if h.worker is not None else "")
            raise StepLogError(path, None, f"{other} and {path} are both {who} of run "
                                           f"'{h.run}': give each stream's log once")
    return [log for _, log in read.values()]


class StepLogWriter:
    """Appends records to a step log, one JSON line each; a new log is created 0600.

    Lines are written whole (so a reader never sees half of one unless the process dies
    mid-write) and flushed at most ``flush_every`` seconds apart and on :meth:`close`.
    Not thread-safe: one thread (the probe's sender) owns a writer.
    """

    def __init__(self, path: str | os.PathLike[str], flush_every: float = 1.0):
        self.path = Path(path)
        if self.path.parent and not self.path.parent.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
        # 0600: a step log holds host names, command lines and parameter names.
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._fh: IO[str] | None = open(  # noqa: SIM115 - closed by close()
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

