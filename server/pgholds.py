"""Which runs the servers sharing a PostgreSQL database are streaming: their holds.

A server holds a run while it takes the run's stream: a shared, session-level advisory
lock on the run id (its own key space, :data:`HOLDS`) on the server's writing connection,
taken with the first batch it stores and let go when the run ends or its stream to this
server is lost (:meth:`server.storage.Store.mark_interrupted`). PostgreSQL drops a
session's locks when the session ends, so a server that stopped or died (kill -9, a lost
machine) holds nothing.

A server that would mark runs interrupted (one starting: every ``live`` run; one whose
stream of a run dropped: that run; every server, now and then: runs whose server died with
their stream) marks only those that no server holds
(:meth:`RunHolds.unheld`): it tries an exclusive transaction-level lock on each, which a
holder's shared lock refuses and which, once taken, keeps any server from taking up the run
until the marking commits (the batch that does then sets it ``live`` again). Shared locks
never wait for each other, so servers taking turns at a run never wait here. Runs on the
writer thread; imports psycopg only through :mod:`server.pgdb`, which owns one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

HOLDS = 0x67727268  # "grrh"
"""Seed of the run-id hash that keys a server's hold on a run (``hashtextextended``)."""


class RunHolds:
    """The runs this server holds on its writing connection (see module doc)."""

    def __init__(self) -> None:
        self._conn: Any = None
        self._held: set[str] = set()

    def _on(self, raw: Any) -> None:
        # A new connection (the old one broke, and with it its locks) holds nothing yet.
        if raw is not self._conn:
            self._conn, self._held = raw, set()

    def hold(self, raw: Any, run_id: str) -> None:
        """Hold ``run_id`` on the psycopg connection ``raw`` (once: locks stack)."""
        self._on(raw)
        if run_id not in self._held:
            raw.execute("SELECT pg_advisory_lock_shared(hashtextextended(%s, %s))",
                        (run_id, HOLDS))
            self._held.add(run_id)

    def release(self, raw: Any, run_id: str) -> None:
        """Let go of ``run_id`` if held."""
        self._on(raw)
        if run_id in self._held:
            self._held.discard(run_id)
            raw.execute("SELECT pg_advisory_unlock_shared(hashtextextended(%s, %s))",
                        (run_id, HOLDS))

    def unheld(self, raw: Any, run_ids: Sequence[str]) -> list[str]:
        """Those of ``run_ids`` no server holds (this one included), kept so until the
        transaction ``raw`` is in ends."""
        self._on(raw)
        # A session's own shared lock does not refuse its exclusive one: ask only of the
        # runs this server does not hold itself.
        ask = [r for r in run_ids if r not in self._held]
        if not ask:
            return []
        rows = raw.execute(
            "SELECT id FROM unnest(%s::text[]) AS r(id) "
            "WHERE pg_try_advisory_xact_lock(hashtextextended(id, %s))",
            (ask, HOLDS)).fetchall()
        return [r[0] for r in rows]
