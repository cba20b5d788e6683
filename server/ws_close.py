"""Which refusal closes a websocket with which close code.

Only the websocket routes (:mod:`server.ws`, :mod:`server.ws_ingest`) import this; the
plain core raises :mod:`server.errors`. The codes themselves are the wire contract's
(:class:`gradwatch.frames.CloseCode`, documented in ``server/API.md``): the probe's streamer
reads them by the same names.
"""

from __future__ import annotations

from gradwatch.frames import CloseCode
from gradwatch.server.errors import (
    FrameTooBig,
    IdleConnection,
    InvalidFrame,
    InvalidStream,
    Refused,
    RunLimitReached,
    SlowReader,
    StorageFailed,
    StoreBusy,
    StreamOwned,
    TooManyConnections,
    TooManyFrames,
    UnreadableFrame,
)

_CODES: dict[type[Refused], CloseCode] = {
    IdleConnection: CloseCode.GOING_AWAY,
    UnreadableFrame: CloseCode.UNSUPPORTED,
    InvalidFrame: CloseCode.INVALID,
    InvalidStream: CloseCode.INVALID,
    RunLimitReached: CloseCode.POLICY,
    FrameTooBig: CloseCode.TOO_BIG,
    TooManyFrames: CloseCode.TRY_LATER,
    TooManyConnections: CloseCode.TRY_LATER,
    SlowReader: CloseCode.TRY_LATER,
    StoreBusy: CloseCode.TRY_LATER,
    StorageFailed: CloseCode.TRY_LATER,
    StreamOwned: CloseCode.NOT_OWNER,
}


def close_code(err: Refused) -> CloseCode:
    """The close code that answers a refusal."""
    return _CODES.get(type(err), CloseCode.POLICY)


def short(reason: str, limit: int = 123) -> str:
    """A close reason cut to the 123 bytes a websocket close frame can carry."""
    b = reason.encode()
    if len(b) <= limit:
        return reason
    return b[:limit - 3].decode(errors="ignore") + "..."
