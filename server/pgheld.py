"""The writer's new step rows of a transaction on PostgreSQL, held until their chunk is
packed (:mod:`server.pgpack`) or a statement needs them stored.

Runs on the storage writer thread only, inside its :class:`server.pgdb.PgConn`. Plain
module: no FastAPI, no psycopg import.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gradwatch.server.db import CHUNK
from gradwatch.server.pgarrays import literal
from gradwatch.server.pgpack import PARAM_COLUMNS, STEP_COLUMNS
from gradwatch.server.steptable import PARAMS_INSERT, STEPS_INSERT

_ROW_TYPES = ("BIGINT", *(t for _, t in STEP_COLUMNS), "BOOLEAN", "BYTEA", "BYTEA")
"""The types of a ``step_rows`` row: sid, the ``steps`` columns, pkept, pnorms, pfresh."""
_STORE = ("INSERT INTO step_rows SELECT * FROM unnest("
          + ", ".join(f"%s::{t}[]" for t in _ROW_TYPES) + ")")
"""The held steps into ``step_rows``, one statement: a column of them per array."""


def touches(s: str) -> bool:
    """Whether a statement (PostgreSQL's form) may read or write steps: the rows held by
    :class:`HeldRows` go to ``step_rows`` before it."""
    return "step" in s or "param_" in s or "gw_" in s or s == "COMMIT"


class HeldRows:
    """The writer's new ``steps`` and ``param_norms`` rows of the open transaction, by
    chunk, held until the chunk's summary packs them or a statement needs them stored.

    A batch that holds a whole chunk (an import, a stream catching up) then writes it
    packed: its rows never enter ``step_rows`` to be deleted a moment later, leaving
    dead rows behind. Runs on the writer thread (its :class:`server.pgdb.PgConn`).
    """

    def __init__(self) -> None:
        self._steps: dict[tuple[int, int], dict[int, tuple[Any, ...]]] = {}
        """(sid, chunk): the held steps' rows, by step."""
        self._norms: dict[tuple[int, int], tuple[Any, Any]] = {}
        """(sid, step) of a held step: its per-parameter norms and fresh norms."""

    def hold(self, sql: str, rows: list[Sequence[Any]]) -> bool:
        """Take the rows of the writer's insert of steps or of their per-parameter norms
        (SQLite's words: :data:`~server.steptable.STEPS_INSERT`,
        :data:`~server.steptable.PARAMS_INSERT`). False: another statement, or norms of a
        step not held (stored before: they go to its row as outside a transaction)."""
        if sql == STEPS_INSERT:
            for r in rows:
                self._steps.setdefault((r[0], r[1] // CHUNK), {})[r[1]] = tuple(r)
            return True
        if sql != PARAMS_INSERT or not all(
                r[1] in self._steps.get((r[0], r[1] // CHUNK), ()) for r in rows):
            return False
        for r in rows:
            self._norms[(r[0], r[1])] = (r[2], r[3])
        return True

    def arrays(self, sid: int, chunk: int) -> list[str | None]:
        """The held rows of one chunk as ``gw_put_agg``'s arrays (array literals,
        :mod:`server.pgarrays`; NULLs: none), let go."""
        held = self._steps.pop((sid, chunk), None)
        if held is None:
            return [None] * (len(STEP_COLUMNS) + len(PARAM_COLUMNS))
        order = sorted(held)
        cols = [c if any(x is not None for x in c) else None  # all NULL: as _agg
                for c in zip(*(held[k] for k in order), strict=True)][1:]
        out = [literal(c, t) for c, (_, t) in zip(cols, STEP_COLUMNS, strict=True)]
        norms = [(k, *self._norms.pop((sid, k))) for k in order if (sid, k) in self._norms]
        if not norms:
            return [*out, "{}", None, None]
        pstep, pnorms, pfresh = zip(*norms, strict=True)
        return [*out, literal(pstep, "BIGINT"), literal(pnorms, "BYTEA"),
                None if all(x is None for x in pfresh) else literal(pfresh, "BYTEA")]

    def store(self, conn: Any) -> None:
        """Insert every held row into ``step_rows``, a step's per-parameter norms in its
        row (psycopg ``conn``): one statement, whatever the number of rows."""
        norms = self._norms
        rows = [(*r, (r[0], r[1]) in norms, *norms.get((r[0], r[1]), (None, None)))
                for part in self._steps.values() for r in part.values()]
        self.drop()
        if rows:
            conn.execute(_STORE, [literal(c, t) for c, t in
                                  zip(zip(*rows, strict=True), _ROW_TYPES, strict=True)])

    def drop(self) -> None:
        """Forget every held row (the transaction rolled back)."""
        self._steps.clear()
        self._norms.clear()

