"""The ack of a stream: the highest seq below which every record is stored.

A batch may skip seqs (a line its sender could not read, or a sender that jumps ahead); the
ack then stays below the gap however far later records go, and moves past it once the gap
is filled, over the records stored beyond it meanwhile. Runs on the storage writer thread,
inside the batch's transaction.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable


def advance(conn: sqlite3.Connection, rid: int, rank: int, acked: int,
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
    for (s,) in conn.execute("SELECT seq FROM records WHERE rid=? AND rank=? AND seq>? "
                             "ORDER BY seq", (rid, rank, p)):
        if s != p + 1:
            break
        p = s
    return p
