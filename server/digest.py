"""Ingest frames validated and reduced to what storage needs: a :class:`Digest`.

Validation against the wire contract is the costliest step of ingest and holds the GIL,
so the server can run :func:`parse_to_digest` in a worker process: it validates a frame
with the wire models and returns plain tuples (each record's JSON line, its step row),
cheap to send back. Storage then re-reads a record into a model only where it needs one:
headers, optimizers, stats, end, and steps that carry a finding fact (the only steps the
:class:`~gradwatch.verdict.Verdict` turns into findings). Plain module: no FastAPI.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from typing import Any, NamedTuple

from gradwatch.frames import Hello
from gradwatch.server.ingest import FrameError, parse_frame
from gradwatch.server.series import Row, row_from_step
from gradwatch.verdict import has_finding_facts
from gradwatch.wire import IngestBatch, Step


class Item(NamedTuple):
    """One record of a batch."""

    seq: int
    kind: str
    t: float
    body: str
    """The record as one JSON line (stored as is; re-read with ``parse_record``)."""
    row: Row | None
    """Its step row, for step records."""
    flagged: bool
    """A step with a finding fact (stale, leaked, late or discarded contributions)."""


class Digest(NamedTuple):
    """A validated batch of one (run, rank) stream."""

    run: str
    rank: int
    items: list[Item]


def item(r: Any, rank: int) -> Item:
    """The :class:`Item` of one validated record model."""
    body = r.__pydantic_serializer__.to_json(r, exclude_none=True).decode()
    if isinstance(r, Step):
        return Item(r.seq, "step", r.t, body, row_from_step(r, rank), has_finding_facts(r))
    return Item(r.seq, r.type, r.t, body, None, False)


def digest(batch: IngestBatch) -> Digest:
    """The digest of a validated batch."""
    return Digest(batch.run, batch.rank, [item(r, batch.rank) for r in batch.records])


def digest_records(run: str, rank: int, records: Iterable[Any]) -> Digest:
    """The digest of record models (an imported step log)."""
    return Digest(run, rank, [item(r, rank) for r in records])


def exit_with_parent(parent: int) -> None:
    """In a parser process: exit when the server process is gone (even after kill -9)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="gradwatch-parent-watch", daemon=True).start()


def parse_to_digest(text: str) -> tuple[str, Any]:
    """Validate one ingest frame: ``("hello", Hello)``, ``("batch", Digest)`` or
    ``("error", (code, reason))``. Runs in a worker process or a thread."""
    try:
        frame = parse_frame(text)
    except FrameError as e:
        return "error", (e.code, e.reason)
    if isinstance(frame, Hello):
        return "hello", frame
    return "batch", digest(frame)
