"""The writer's new step rows of a transaction on PostgreSQL, held until their chunk is
packed (:mod:`server.pgpack`) or a statement needs them stored.

Runs on the storage writer thread only, inside its :class:`server.pgdb.PgConn`. Plain
module: no FastAPI, no psycopg import.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gradwatch.server.db import CHUNK
from gradwatch.server.pgpack import PARAM_COLUMNS, PARAM_INSERT, STEP_COLUMNS, STEP_INSERT

_FLOATS = frozenset(i for i, (_, t) in enumerate(STEP_COLUMNS) if t == "DOUBLE PRECISION")
_STEP_ROWS = STEP_INSERT.split("?")[0]
_PARAM_ROWS = PARAM_INSERT.split("?")[0]
Rows = dict[tuple[int, int], list[tuple[Any, ...]]]


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
        self._steps: Rows = {}
        self._params: Rows = {}

    def hold(self, s: str, rows: list[Sequence[Any]]) -> bool:
        """Take the rows of the writer's insert of steps or of their per-parameter norms
        (:data:`~server.pgpack.STEP_INSERT`, :data:`~server.pgpack.PARAM_INSERT`; False:
        another statement)."""
        held = self._steps if s.startswith(_STEP_ROWS) else \
            self._params if s.startswith(_PARAM_ROWS) else None
        if held is None:
            return False
        for r in rows:
            held.setdefault((int(r[0]), int(r[1]) // CHUNK), []).append(tuple(r))
        return True

    def arrays(self, sid: int, chunk: int) -> list[Any]:
        """The held rows of one chunk as ``gw_put_agg``'s arrays (NULLs: none), let go."""
        steps = self._steps.pop((sid, chunk), None)
        params = self._params.pop((sid, chunk), [])
        if steps is None:
            if params:  # never without their steps; stored as they came, to be safe
                self._params[(sid, chunk)] = params
            return [None] * (len(STEP_COLUMNS) + len(PARAM_COLUMNS))
        steps.sort(key=lambda r: r[1])
        cols: list[Any] = [list(c) for c in zip(*steps, strict=True)][1:]
        for i in _FLOATS:  # psycopg dumps a list of one type
            cols[i] = [None if x is None else float(x) for x in cols[i]]
        cols = [None if all(x is None for x in c) else c for c in cols]  # as _agg
        if not params:
            return [*cols, [], None, None]
        params.sort(key=lambda r: r[1])
        _, pstep, norms, fresh = (list(c) for c in zip(*params, strict=True))
        fresh = [_bytes(x) for x in fresh]
        return [*cols, pstep, [_bytes(x) for x in norms],
                None if all(x is None for x in fresh) else fresh]

    def store(self, conn: Any) -> None:
        """Insert every held row into ``step_rows``, a step's per-parameter norms in its
        row (psycopg ``conn``)."""
        params = {(r[0], r[1]): r[2:] for part in self._params.values() for r in part}
        rows = [(*r, (r[0], r[1]) in params, *params.pop((r[0], r[1]), (None, None)))
                for part in self._steps.values() for r in part]
        self._steps.clear()
        self._params.clear()
        for s, got in ((f"INSERT INTO step_rows VALUES({','.join(['%s'] * len(rows[0]))})"
                        if rows else "", rows),
                       (PARAM_INSERT.replace("?", "%s"),  # norms of a step stored before
                        [(*k, *v) for k, v in params.items()])):
            if got:
                with conn.cursor() as cur:
                    cur.executemany(s, got)

    def drop(self) -> None:
        """Forget every held row (the transaction rolled back)."""
        self._steps.clear()
        self._params.clear()


def _bytes(x: bytes | str | None) -> bytes | None:
    """Packed norms as ``bytea`` holds them (the JSON form's text as its UTF-8 bytes)."""
    return x.encode() if isinstance(x, str) else x
