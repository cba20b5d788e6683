"""A step log read as it arrives: lines split, validated and batched a block at a time.

``POST /api/runs/import`` and ``serve --import`` feed bytes in (:class:`LogBlocks`), and
get back batches of validated records ready for storage (:class:`~server.batch.Batch`,
built here, off the writer thread). Memory holds one block of text and its records,
however long the log. The rules are the step-log reader's: a header first and only
first, every line a valid record (an error names the line and the field), a truncated
*last* line tolerated with a warning (:mod:`gradwatch.logreader`'s rules, called here), a
log starting with gzip's magic bytes read through gzip.

A gzip upload's limit counts compressed bytes, so the log's text is bounded too, once
inflated: its size and the length of one line. Inflation hands on a block at a time, and
blank lines are skipped at C speed (a regular expression steps over them), so
a gzip of a gigabyte of newlines is refused in seconds, never held in memory. Plain module:
no FastAPI.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable, Iterator
from typing import IO, Any

from gradwatch.gcpause import gc_paused
from gradwatch.logreader import EMPTY, GZIP_MAGIC, StepLogError, header_of, records_of
from gradwatch.server.batch import Batch, batch_of_records
from gradwatch.server.errors import InvalidLog, LogTooBig
from gradwatch.wire import Header

BLOCK_BYTES = 1 << 20
"""Text handed on at a time (a block ends at a line's end)."""

MAX_LOG_BYTES = 512 << 20
"""Default for the largest log text, inflated (``Settings.max_import_bytes``)."""
MAX_LINE_BYTES = 16 << 20
"""Default for the longest line (``Settings.max_line_bytes``): a streamed record is under
1 MiB (a frame), a written one far less; a line is held whole while it is read."""

_BLANKS = re.compile(rb"[ \t\r\n\x0b\x0c]*")
"""What ``bytes.strip()`` strips: a run of it is blank lines (and a line's indent)."""


class LogBlocks:
    """Turns a step log's bytes, fed in pieces, into validated blocks of records.

    Args:
        name: what errors call the log (``upload``, a file's path).
        run: the run id to give the header (a free one); ``None``: the log's own.
        max_bytes: the most bytes of text the log may hold, inflated.
        max_line: the most bytes one line may hold.
    """

    def __init__(self, name: str, run: str | None = None, max_bytes: int = MAX_LOG_BYTES,
                 max_line: int = MAX_LINE_BYTES):
        self.name = name
        self.run = run
        self.max_bytes = max_bytes
        self.max_line = max_line
        self.size = 0
        """Bytes of text so far (inflated)."""
        self.header: Header | None = None
        self.warnings: list[str] = []
        self.lines = 0
        self._tail = b""
        self._start = b""
        """The first bytes, until there are enough to tell a gzip stream."""
        self._gunzip: Any = None
        """A ``zlib`` decompressor once the log is known to be gzip-compressed; False: plain."""

    def _plain(self, data: bytes) -> bytes:
        """The text of ``data``; for a gzip log at most a block of it, the rest of the
        input kept for :meth:`pieces` to drain."""
        if self._gunzip is None:
            self._start += data
            if len(self._start) < len(GZIP_MAGIC):
                return b""
            data, self._start = self._start, b""
            self._gunzip = (zlib.decompressobj(wbits=31) if data.startswith(GZIP_MAGIC)
                            else False)
        if self._gunzip is False:
            return data
        try:
            return self._gunzip.decompress(self._gunzip.unconsumed_tail + data, BLOCK_BYTES)
        except zlib.error as e:
            raise InvalidLog(f"{self.name}: the compressed log is corrupt ({e})") from None

    def pieces(self, data: bytes) -> Iterator[list[tuple[int, bytes]]]:
        """Take more bytes; the complete lines they end, a block of text at a time
        (numbered, each with its newline; blank lines left out). An async caller yields to
        its loop between pieces.

        Raises:
            LogTooBig: the text passes ``max_bytes``, or a line ``max_line``.
            InvalidLog: a corrupt gzip stream.
        """
        while True:
            yield self._lines(self._plain(data))
            if not (self._gunzip and self._gunzip.unconsumed_tail):
                return
            data = b""  # what is left of it is the decompressor's unconsumed tail

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """:meth:`pieces`, every line at once."""
        return [line for piece in self.pieces(data) for line in piece]

    def _lines(self, data: bytes) -> list[tuple[int, bytes]]:
        if not data:
            return []
        self.size += len(data)
        if self.size > self.max_bytes:
            raise LogTooBig(f"{self.name}: step log too big: over {self.max_bytes} bytes "
                            f"of text (inflated); the server's --max-import-bytes sets the "
                            f"limit")
        data = self._tail + data
        cut = data.rfind(b"\n")
        if cut < 0:
            self._tail = data
            self._check_line(len(data), self.lines + 1)
            return []
        self._tail = data[cut + 1:]
        out = []
        newlines = data.count(b"\n", 0, cut + 1)
        if newlines * 16 <= cut + 1:  # lines as long as records: split at C speed
            n = self.lines
            for raw in data[:cut].split(b"\n"):
                n += 1
                if raw.strip():
                    if cut > self.max_line:
                        self._check_line(len(raw), n)
                    out.append((n, raw + b"\n"))
            self.lines += newlines
            self._check_line(len(self._tail), self.lines + 1)
            return out
        # Mostly blank (no record is under 16 bytes): step over blank runs, never making
        # a Python object per blank line.
        n, counted, pos = self.lines, 0, 0
        if newlines == cut + 1:  # nothing but newlines: no line to read
            pos = cut
        while pos < cut:
            pos = _BLANKS.match(data, pos, cut).end()  # type: ignore[union-attr]
            if pos >= cut:
                break
            start = data.rfind(b"\n", 0, pos) + 1
            end = data.find(b"\n", pos)  # <= cut: data[cut] is a newline
            n += data.count(b"\n", counted, start) + 1
            counted = end + 1
            self._check_line(end - start, n)
            out.append((n, data[start:end + 1]))
            pos = end + 1
        self.lines += newlines
        self._check_line(len(self._tail), self.lines + 1)
        return out

    def _check_line(self, length: int, n: int) -> None:
        if length > self.max_line:
            raise LogTooBig(f"{self.name}: line {n} is longer than {self.max_line} bytes; "
                            f"no step-log record is that long")

    def finish(self) -> list[tuple[int, bytes]]:
        """The last line, if it did not end with a newline (possibly truncated: it stays
        without one, which is how the step-log rules tell it)."""
        out = []
        if self._gunzip is None and self._start:  # shorter than gzip's magic: plain
            self._gunzip, self._tail = False, self._tail + self._start
        elif self._gunzip:
            out = self._lines(self._gunzip.flush())  # what inflation still held
        tail, self._tail = self._tail, b""
        if not tail.strip():
            return out
        self.lines += 1
        return [*out, (self.lines, tail)]

    def parse(self, lines: list[tuple[int, bytes]]) -> list[Any]:
        """Validate numbered lines into records by the step-log reader's rules
        (:func:`gradwatch.logreader.header_of`, :func:`~gradwatch.logreader.records_of`),
        the header replaced by its new id.

        Raises:
            InvalidLog: a line is not a valid record, or breaks the header rules.
        """
        out: list[Any] = []
        try:
            if self.header is None and lines:
                (n, raw), lines = lines[0], lines[1:]
                h = header_of(self.name, n, raw)
                self.header = h if self.run is None else h.model_copy(update={"run": self.run})
                out.append(self.header)
            if lines:
                assert self.header is not None
                out += [r for _, r in records_of(self.name, lines, self.header.v,
                                                 self.warnings)]
        except StepLogError as e:
            raise InvalidLog(str(e)) from None
        return out

    def batch(self, lines: list[tuple[int, bytes]]) -> Batch:
        """:meth:`parse`, as a batch of the header's stream ready for storage.

        Raises:
            InvalidLog: as :meth:`parse`.
        """
        recs = self.parse(lines)
        h = self.header
        if h is None:
            return Batch(self.run or "", 0, [])
        return batch_of_records(h.run, h.rank, recs)

    def check_end(self) -> None:
        """Raises :class:`InvalidLog` for a log without a header line (empty)."""
        if self.header is None:
            raise InvalidLog(f"{self.name}: {EMPTY}")


def batch_of_lines(name: str, lines: list[tuple[int, bytes]], run: str, rank: int,
                   v: int) -> Batch:
    """Numbered lines after the header's block, validated at version ``v`` into a batch of
    ``(run, rank)``: what a parser process does (no state crosses but the arguments).

    Raises:
        InvalidLog: as :meth:`LogBlocks.parse` (a header here is a second header).
    """
    with gc_paused():
        try:
            recs = [r for _, r in records_of(name, lines, v, [])]
        except StepLogError as e:
            raise InvalidLog(str(e)) from None
        return batch_of_records(run, rank, recs)


def file_blocks(fh: IO[bytes], size: int = BLOCK_BYTES) -> Iterator[bytes]:
    """A binary file's bytes, a block at a time."""
    while chunk := fh.read(size):
        yield chunk


def validate(name: str, chunks: Iterable[bytes], max_bytes: int = MAX_LOG_BYTES,
             max_line: int = MAX_LINE_BYTES) -> list[str]:
    """Read a whole log through, storing nothing; its warnings.

    Raises:
        InvalidLog: the log is not valid (the error names the line and field).
        LogTooBig: it passes ``max_bytes`` of text or has a line over ``max_line``.
    """
    blocks = LogBlocks(name, max_bytes=max_bytes, max_line=max_line)
    for data in chunks:
        blocks.parse(blocks.feed(data))
    blocks.parse(blocks.finish())
    blocks.check_end()
    return blocks.warnings


class MultipartFile:
    """The content of the ``file`` field of a ``multipart/form-data`` body, streamed.

    Fed the body in pieces, it hands on the bytes of the first part named ``file`` as they
    arrive (keeping back only what could be the start of the closing boundary), so an
    upload is never held whole.

    Args:
        ctype: the request's Content-Type (with its ``boundary``).
    Raises:
        InvalidLog: no boundary in the Content-Type.
    """

    def __init__(self, ctype: str):
        boundary = None
        for part in ctype.split(";")[1:]:
            k, _, v = part.strip().partition("=")
            if k.lower() == "boundary":
                boundary = v.strip().strip('"')
        if not boundary:
            raise InvalidLog("multipart upload without a boundary in its Content-Type")
        self._delim = b"\r\n--" + boundary.encode("latin-1")
        self._buf = b"\r\n"  # the first delimiter has no CRLF before it
        self._state = "preamble"  # -> headers -> body (the file) -> done
        self.filename = "upload"

    def feed(self, data: bytes) -> bytes:
        """Take more of the body; the file bytes it completes."""
        self._buf += data
        out = []
        while True:
            if self._state == "preamble" or self._state == "skip":
                i = self._buf.find(self._delim)
                if i < 0:
                    self._buf = self._buf[-len(self._delim):]
                    break
                self._buf = self._buf[i + len(self._delim):]
                self._state = "headers"
            elif self._state == "headers":
                i = self._buf.find(b"\r\n\r\n")
                if i < 0:
                    if len(self._buf) > 16 << 10:
                        raise InvalidLog("multipart part headers too long")
                    break
                head = self._buf[:i].decode("latin-1")
                self._buf = self._buf[i + 4:]
                self._state = "skip"
                for line in head.split("\r\n"):
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-disposition":
                        params = _params(value)
                        if params.get("name") == "file":
                            self._state = "body"
                            self.filename = params.get("filename") or "upload"
            elif self._state == "body":
                i = self._buf.find(self._delim)
                if i >= 0:
                    out.append(self._buf[:i])
                    self._buf = b""
                    self._state = "done"
                    break
                keep = len(self._delim)
                out.append(self._buf[:-keep])
                self._buf = self._buf[-keep:]
                break
            else:
                self._buf = b""
                break
        return b"".join(out)

    def finish(self) -> None:
        """Raises :class:`InvalidLog` if the body held no complete ``file`` field."""
        if self._state != "done":
            raise InvalidLog("multipart upload without a complete 'file' field")


def _params(value: str) -> dict[str, str]:
    out = {}
    for part in value.split(";")[1:]:
        k, _, v = part.strip().partition("=")
        out[k.strip().lower()] = v.strip().strip('"')
    return out
