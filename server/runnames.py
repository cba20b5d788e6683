"""What a new run is called: a display name no other run has, an id no other run has.

Two replays of one log, or two imports of it, become two runs that never read alike in the
run list. Functions over the writer's connection (:class:`server.storage.Store` calls them
on the writer thread). Plain module: no FastAPI.
"""

from __future__ import annotations

from gradwatch.server.backend import Conn


def name_taken(conn: Conn, name: str) -> bool:
    """Whether a run is called ``name``."""
    return conn.execute("SELECT 1 FROM runs WHERE name=?", (name,)).fetchone() is not None


def distinct_name(conn: Conn, name: str) -> str:
    """``name``, or ``name (2)``, ``name (3)``... when another run is called that."""
    n, cand = 1, name
    while name_taken(conn, cand):
        n += 1
        cand = f"{name[:190]} ({n})"
    return cand


def free_id(conn: Conn, wanted: str) -> str:
    """``wanted`` if no run has that id, else ``wanted-2``, ``wanted-3``, ..."""
    base, n, cand = wanted[:56], 1, wanted
    while conn.execute("SELECT 1 FROM runs WHERE id=?", (cand,)).fetchone():
        n += 1
        cand = f"{base}-{n}"
    return cand
