"""What the server refuses, in its own words: the domain errors of ingest and storage.

The plain core (parsing, limits, storage) raises these; each route decides what the
client sees: the websocket routes a close code (:mod:`server.ws_close`), the REST routes
an HTTP status (:mod:`server.api`). Every error carries ``reason``, a sentence that says
what was wrong and what to do.
"""

from __future__ import annotations


class Refused(Exception):
    """Input the server will not take; nothing of it was stored."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class UnreadableFrame(Refused):
    """An ingest frame that is not JSON text (binary, or not JSON at all)."""


class InvalidFrame(Refused):
    """An ingest frame that breaks the wire contract (the reason names the field)."""


class FrameTooBig(Refused):
    """An ingest frame over the size limit."""


class TooManyFrames(Refused):
    """An ingest connection sending faster than the rate limit."""


class IdleConnection(Refused):
    """An ingest connection that sent nothing for longer than the idle timeout."""


class SlowReader(Refused):
    """A client that does not read what the server sends it (acks) within the deadline."""


class TooManyConnections(Refused):
    """An ingest connection beyond the limit of open ones."""


class InvalidStream(Refused):
    """Records that break the stream rules: seq order, or a stream without its header."""


class StreamOwned(Refused):
    """Records, an End or a resume for a (run, rank) stream that another connection's key
    owns, from a connection that did not present that key."""


class RunLimitReached(Refused):
    """A new run while the server already holds as many as it may."""


class StoreBusy(Refused):
    """The storage writer's queue is full: retry later."""


class NameTaken(Refused):
    """A rename to a display name another run already has (run names stay distinct)."""


class StorageFailed(Refused):
    """A write the disk refused (full, or an I/O error): nothing of the batch was stored,
    everything stored before stays readable; resend once there is space."""


class NewerDatabase(Exception):
    """A data directory written by a newer gradwatch (a schema this one does not know)."""


class InvalidLog(Refused):
    """An imported step log with a line that is not a valid record (the reason names the
    line and the field)."""


class LogTooBig(Refused):
    """An imported step log over the size limit once inflated, or with a line over the line
    limit (nothing stored)."""


class RunLive(Refused):
    """A delete of a run a keyed stream is still writing (its probe would lose the run to
    whoever re-created it)."""
