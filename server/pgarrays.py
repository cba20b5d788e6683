"""PostgreSQL array literals of the writer's held step columns, built in Python.

The writer hands a chunk's held rows to PostgreSQL as one array per column
(:class:`server.pgheld.HeldRows`). psycopg adapts a Python list element by element in
Python (a dumper and a quoting test per value), which cost more than the rest of storing
the batch; a column here is one ``str.join`` over a map, and the server parses it once with
its own ``array_in`` (the statement casts the text: ``%s::BIGINT[]``). Values read back
equal: a float as ``float.__repr__`` (the shortest text that reads back as the same
double, which PostgreSQL's input reads exactly), bytes as ``bytea``'s hex form. Plain
module: no psycopg, no FastAPI.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_NULL = "NULL"


def _int(x: Any) -> str:
    return _NULL if x is None else format(x, "d")


def _float(x: Any) -> str:
    return _NULL if x is None else float.__repr__(float(x))


def _text(x: Any) -> str:
    if x is None:
        return _NULL
    # quoted, with its backslashes and double quotes escaped: any text reads back as is
    return '"' + x.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _bytea(x: Any) -> str:
    if x is None:
        return _NULL
    if isinstance(x, str):  # packed norms kept as the wire's JSON text: its UTF-8 bytes
        x = x.encode()
    return '"\\\\x' + x.hex() + '"'


_ITEM = {"BIGINT": _int, "INTEGER": _int, "DOUBLE PRECISION": _float, "TEXT": _text,
         "BYTEA": _bytea, "BOOLEAN": lambda x: _NULL if x is None else "t" if x else "f"}
"""How one value of a column's type is written inside an array literal."""


def literal(values: Sequence[Any] | None, kind: str) -> str | None:
    """``values`` as the text of a PostgreSQL array of ``kind`` (a type name of
    :data:`_ITEM`); None stays None (SQL NULL).

    Raises:
        KeyError: a type this module does not write.
    """
    if values is None:
        return None
    item = _ITEM[kind]
    if kind in ("BIGINT", "INTEGER") and None not in values:
        return "{" + ",".join(map("{:d}".format, values)) + "}"
    return "{" + ",".join(map(item, values)) + "}"
