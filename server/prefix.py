"""The ack of a stream: the highest seq below which every record is stored.

A batch may skip seqs (a line its sender could not read, or a sender that jumps ahead); the
ack then stays below the gap however far later records go, and moves past it once the gap
is filled, over the records stored beyond it meanwhile. (A step resent under a new seq
beyond a gap is not stored, so the ack stops there once the gap fills: resent again, it
moves on.) Runs on the storage writer thread,
inside the batch's transaction.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gradwatch.server.backend import Conn

_STORED_AFTER = (
    "SELECT seq FROM records WHERE rid=? AND rank=? AND seq>? "
    "UNION SELECT seq FROM scalars WHERE rid=? AND rank=? AND seq>? "
    "UNION SELECT s.seq FROM steps s JOIN series e ON s.sid=e.sid "
    "WHERE e.rid=? AND e.rank=? AND s.seq>? ORDER BY 1")
"""The seqs a stream has stored above one, wherever schema 3 keeps their records."""


def advance(conn: Conn, rid: int, rank: int, acked: int,
            seqs: Iterable[int], highest: int) -> int:
    """The stream's ack once the records ``seqs`` (increasing) are stored.

    Args:
        acked: the ack before them.
        highest: the highest seq stored in the stream, these included.
    """
    p = acked
    for s in seqs:
        if s <= p:
            continue
        if s != p + 1:
            break
        p = s
    if p == acked or p >= highest:
        return p  # the gap at ``acked + 1`` stays open, or nothing is stored past ``p``
    # Past ``p``: this batch's later records and records stored earlier beyond a gap it
    # filled. Each record is walked over once before it joins the ack, so this costs
    # what was stored out of order, once.
    for (s,) in conn.execute(_STORED_AFTER, (rid, rank, p) * 3):
        if s != p + 1:
            break
        p = s
    return p
