"""Python's cycle collector: paused while a block of records is validated or laid out,
and tuned for a long-running server process.

A block of a few thousand lines makes tens of thousands of small container objects (models,
lists, dicts), none in a cycle. Each 700 of them start a young collection, and the survivors
(the block's records, kept until the block is stored) are walked again by every older one:
measured on a 10,000-step log, validation ran at about half speed with the collector on.
Refcounting frees everything a block makes; a cycle made meanwhile waits for the next
collection after the pause.

A server's full collections walk everything alive: the tens of thousands of objects its
start-up made (modules, schemas, the app) and every batch in flight during a burst of
ingest. Each such collection stops the process, live clients' frames included, for tens of
milliseconds. :func:`settle_server_heap` takes start-up's objects out of the collector's
reach and lets a burst's short-lived objects die young.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

SERVER_YOUNG_THRESHOLD = 10_000
"""Net allocations between young collections in a server process (Python's default: 700).
At the default a batch in flight survives a few young collections, is promoted, and makes
a full collection due within a second of a burst."""


@contextmanager
def gc_paused() -> Iterator[None]:
    """The collector off inside the block (process-wide, so only around bounded work),
    back to its state after it, also on an error. Nests."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def settle_server_heap() -> None:
    """In a long-running server process, once start-up is done (the app built, its modules
    imported): freeze what exists so no collection walks it again (``gc.freeze``), and
    collect the young generation every :data:`SERVER_YOUNG_THRESHOLD` allocations.

    Frozen objects are still freed by refcounting; only a cycle among them, made after
    this, waits for the process's end. So the ``serve`` command calls this, once; a
    library never does.
    """
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(SERVER_YOUNG_THRESHOLD, older, oldest)
