"""Reading the spool (the step log the probe is writing) a frame at a time, for the streamer.

Only complete lines are read (the probe may be half-way through one) and sent as they are.
A spool of lines from elsewhere (a log given to the streamer) is validated line by line at
the version its header names: an invalid line is skipped and counted. A spool this process
wrote itself from records it made or validated (``trusted``: the probe's step log,
replay's) is not validated again: the server validates it, at the trust boundary; only each
line's ``seq`` is read. Lines of records the server already has are passed over, and a line
too long for any frame is skipped and counted. Imports neither torch nor fastapi.

Thread: the streamer's (:class:`gradwatch.stream.Streamer`).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import NamedTuple

from pydantic import ValidationError

from gradwatch.validation import plain_error
from gradwatch.wire import Header, batch_json, parse_record

log = logging.getLogger("gradwatch.stream")

MAX_LINE = 1 << 20
"""Bytes read at a time, at least; a line longer than this can never be sent."""
_SEQ = re.compile(rb'\{"seq":(0|[1-9][0-9]{0,18})[,}]')
"""The ``seq`` a record line opens with, as :func:`gradwatch.wirejson.dump_record` writes
every record (``seq`` is each model's first field)."""


class Piece(NamedTuple):
    """What :meth:`SpoolReader.read` read: a frame of lines, or lines with nothing to send."""

    text: str | None
    """The ``IngestBatch`` frame; None when every line read was already on the server (or
    invalid)."""
    last_seq: int
    end: int
    """The spool offset just past the last line read."""
    records: int
    full: bool
    """The frame stopped at a size limit: more lines are waiting."""


class SpoolReader:
    """Reads ``path`` from :attr:`offset` on, in frames of at most ``max_records`` records
    and about ``max_bytes`` bytes, leaving out records with ``seq <= skip_le``.

    Args:
        path: the spool (plain, not compressed).
        run, rank: what each frame says it is.
        trusted: this process wrote every line of the spool from records it made or
            validated: lines are read for their ``seq``, not validated again (a line that
            does not open with one is validated).
    """

    def __init__(self, path: Path, run: str, rank: int, max_records: int = 1000,
                 max_bytes: int = 512 << 10, *, trusted: bool = False):
        self.path, self.run, self.rank = Path(path), run, rank
        self.trusted = trusted
        self.max_records, self.max_bytes = max_records, max_bytes
        self.offset = 0
        """The next byte to read."""
        self.skip_le = -1
        """Records with a seq up to this are already on the server."""
        self.dropped = 0
        """Lines skipped: invalid, or too long to send."""
        self._v: int | None = None

    def seek(self, offset: int, skip_le: int) -> None:
        """Read from ``offset`` on, leaving out records up to ``skip_le`` (after a resume)."""
        self.offset, self.skip_le = offset, skip_le

    def version(self) -> int | None:
        """The protocol version of the spool (its header's ``v``); None before the header
        is written.

        Raises:
            ValueError: the spool's first line is no header: nothing can say how its lines
                are written.
        """
        if self._v is None:
            try:
                with self.path.open("rb") as fh:
                    first = fh.readline(MAX_LINE)
            except FileNotFoundError:
                return None
            if not first.endswith(b"\n"):
                return None
            header = parse_record(first, 1)  # a header reads the same at every version
            if not isinstance(header, Header):
                raise ValueError(f"{self.path} does not start with a header")
            self._v = header.v
        return self._v

    def read(self) -> Piece | None:
        """The next complete lines (one frame's worth), or None when none is complete yet."""
        v = self.version()
        if v is None:
            return None
        while True:
            try:
                with self.path.open("rb") as fh:
                    fh.seek(self.offset)
                    data = fh.read(self._cut())
            except FileNotFoundError:
                return None
            end = data.rfind(b"\n")
            if end >= 0:
                break
            if len(data) < self._cut():
                return None
            self._skip_line()  # one line over a frame: it can never be sent
        records: list[bytes] = []
        off, size, last_seq, full = self.offset, 0, self.skip_le, False
        for raw in data[:end + 1].split(b"\n")[:-1]:
            if records and (len(records) >= self.max_records or size >= self.max_bytes):
                full = True
                break
            off += len(raw) + 1
            if not raw.strip():
                continue
            seq = self._seq(raw, v)
            if seq is None or seq <= self.skip_le:
                continue  # invalid (counted), or already on the server
            records.append(raw)
            size += len(raw)
            last_seq = seq
        self.offset = off
        if not records:
            return Piece(None, last_seq, off, 0, False)
        self.skip_le = last_seq
        return Piece(batch_json(self.run, self.rank, v, records).decode(), last_seq, off,
                     len(records), full)

    def _seq(self, raw: bytes, v: int) -> int | None:
        """The seq of the line ``raw``; None (counted, said) when it is not a valid record."""
        if self.trusted and (m := _SEQ.match(raw)) is not None:
            return int(m[1])
        try:
            return int(parse_record(raw, v).seq)
        except ValidationError as e:
            self.dropped += 1
            log.warning("gradwatch streamer: skipping an invalid spool line: %s",
                        plain_error(e))
            return None

    def _cut(self) -> int:
        """Bytes read at a time: a line with no newline in as many is skipped."""
        return max(self.max_bytes, MAX_LINE)

    def _skip_line(self) -> None:
        self.dropped += 1
        log.warning("gradwatch streamer: a spool line is over %d bytes; skipped it",
                    self._cut())
        with self.path.open("rb") as fh:
            fh.seek(self.offset)
            while True:
                chunk = fh.read(1 << 16)
                if not chunk:
                    return
                i = chunk.find(b"\n")
                if i >= 0:
                    self.offset += i + 1
                    return
                self.offset += len(chunk)
