"""Websocket close codes, and which refusal closes a connection with which.

Only the websocket routes (:mod:`server.ws`, :mod:`server.ws_ingest`) import this; the
plain core raises :mod:`server.errors`. The codes are a contract (``server/API.md``).
"""

from __future__ import annotations

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

GOING_AWAY = 1001
UNSUPPORTED = 1003
INVALID = 1007
POLICY = 1008
TOO_BIG = 1009
TRY_LATER = 1013
NO_RUN = 4404
NOT_OWNER = 4403

_CODES: dict[type[Refused], int] = {
    IdleConnection: GOING_AWAY,
    UnreadableFrame: UNSUPPORTED,
    InvalidFrame: INVALID,
    InvalidStream: INVALID,
    RunLimitReached: POLICY,
    FrameTooBig: TOO_BIG,
    TooManyFrames: TRY_LATER,
    TooManyConnections: TRY_LATER,
    SlowReader: TRY_LATER,
    StoreBusy: TRY_LATER,
    StorageFailed: TRY_LATER,
    StreamOwned: NOT_OWNER,
}


def close_code(err: Refused) -> int:
    """The close code that answers a refusal."""
    return _CODES.get(type(err), POLICY)


def short(reason: str, limit: int = 123) -> str:
    """A close reason cut to the 123 bytes a websocket close frame can carry."""
    b = reason.encode()
    if len(b) <= limit:
        return reason
    return b[:limit - 3].decode(errors="ignore") + "..."
