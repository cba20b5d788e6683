"""Who may write a (run, rank) stream: the connection that opened it with a key.

A probe sends a random key in its ``hello`` (:class:`~gradwatch.frames.Hello`); the batch
that starts the stream (its header) stores the key's hash with the stream, and from then
on a batch, an End or a resume of that stream is taken only from a connection whose hello
carried the same key. A stream opened without a key (an older probe, an import) stays
open to any writer, as before keys existed. Plain module, run on the storage writer
thread: the check and the claim happen in the same thread that stores, so two
connections racing to open one stream cannot both win.
"""

from __future__ import annotations

import hashlib
import hmac

from gradwatch.server.errors import StreamOwned
from gradwatch.server.runstate import RunState


def key_hash(key: str | None) -> str | None:
    """What the server keeps of a stream key (SHA-256, hex); ``None`` for no key."""
    return None if key is None else hashlib.sha256(key.encode()).hexdigest()


def check(st: RunState | None, rank: int, key: str | None) -> None:
    """Refuse a writer of stream (``st``, ``rank``) that does not hold its key.

    Raises:
        StreamOwned: the stream has a key and ``key`` is not it (or is missing).
    """
    if st is None:
        return
    owned = st.keys.get(rank)
    if owned is None:
        return
    given = key_hash(key)
    if given is None or not hmac.compare_digest(owned, given):
        raise StreamOwned(
            f"stream {st.id}/{rank} belongs to the connection that opened it; send its "
            f"key in a hello first ({'no key was sent' if key is None else 'wrong key'})")


def holds(st: RunState | None, rank: int, key: str | None) -> bool:
    """Whether ``key`` is the key of the stored, keyed stream (``st``, ``rank``)."""
    owned = None if st is None else st.keys.get(rank)
    given = key_hash(key)
    return owned is not None and given is not None and hmac.compare_digest(owned, given)


def claim(st: RunState, rank: int, key: str | None) -> None:
    """Make a stream that this batch starts (no record of it stored yet) ``key``'s."""
    h = key_hash(key)
    if h is not None and rank not in st.max_seq:
        st.keys[rank] = h
