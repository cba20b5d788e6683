"""A pydantic ``ValidationError`` told as one plain sentence: which field, what it holds,
what it must be.

The one translation every reader uses (the step-log reader behind ``check``, ``replay`` and
the server's import; the server's ingest frames; the streamer's spool; a migration), so no
message shows a validator's internals ("Unable to extract tag using discriminator",
``loc`` tuples, ``Input should be``). The caller adds where: ``file:line``, a close reason.
Plain module, any thread.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from pydantic import ValidationError

_KINDS = {list: "a list", dict: "an object", str: "a string", bool: "true or false",
          int: "a number", float: "a number", type(None): "null"}
_SHOWN = 40
"""Characters of a wrong value quoted at most."""


def plain_error(err: ValidationError, subject: str = "record") -> str:
    """The first problem of ``err`` as a sentence naming the field.

    Args:
        err: from validating one record (or frame) of the wire contract, whose kinds are
            told apart by their ``type`` field.
        subject: what was validated: ``"record"`` (a step-log line) or ``"frame"``.

    Returns:
        e.g. ``field 'opt' of the 'step' record is missing``, ``field 't' of the 'end'
        record is "x": it must be a valid number``, ``unknown record type 'bogus' (known:
        header, step, ...)``; ``(and N more problems)`` when there are more.
    """
    errors = err.errors()
    first = errors[0]
    kind, msg = first.get("type", ""), str(first.get("msg", "invalid"))
    ctx: dict[str, Any] = dict(first.get("ctx") or {})
    if kind == "json_invalid":
        detail = str(ctx.get("error", msg))
        if detail.startswith("number out of range"):  # JSON, but an integer of 4300+ digits
            return f"{detail}: integers must fit in 64 bits"
        return f"not valid JSON ({re.sub(r'at line 1 column', 'at column', detail)})"
    owner, path = _where(tuple(first.get("loc", ())), subject)
    missing = [e for e in errors if e.get("type") == "missing"
               and _where(tuple(e.get("loc", ())), subject)[0] == owner]
    if kind == "missing" and len(missing) > 1:  # an empty record: name every field at once
        names = ", ".join(f"'{_where(tuple(e['loc']), subject)[1]}'" for e in missing)
        return _more(f"fields {names} of {owner} are missing", len(errors) - len(missing))
    field = f"field '{path}' of {owner}" if path else owner
    if kind == "missing":
        text = f"{field} is missing"
    elif kind == "extra_forbidden":
        text = f"{owner} has no field '{path}'"
    elif kind == "union_tag_not_found":
        text = f"{owner} has no 'type' field saying which kind of {subject} it is"
    elif kind == "union_tag_invalid":
        known = str(ctx.get("expected_tags", "")).replace("'", "")
        text = f"{owner} has the unknown type '{ctx.get('tag')}' (known: {known})"
    elif kind in ("dict_type", "model_type", "model_attributes_type"):
        text = f"{field} is {_kind(first.get('input'))}, not an object"
    elif kind in ("value_error", "assertion_error"):
        text = f"{field}: {msg.split(', ', 1)[-1]}"  # "Value error, <our own sentence>"
    elif kind == "int_parsing_size":
        text = f"{field} is {_shown(first.get('input'))}: too large for an integer"
    elif " should " in msg:  # "Input should be a valid integer, unable to parse ...": must
        must = msg.split(" should ", 1)[1].split(", unable to", 1)[0]
        text = f"{field} is {_shown(first.get('input'))}: it must {must}"
    else:
        text = f"{field}: {msg[:1].lower()}{msg[1:]}"
    return _more(text, len(errors) - 1)


def _where(loc: tuple[Any, ...], subject: str) -> tuple[str, str]:
    """``(owner, field path)`` of an error's location.

    A tagged union puts the tag (the ``type``) in the location: at its start (a record, a
    frame), or after the index of an item of a list of records (a frame's ``records``, a
    block of lines). What follows the tag is the field path (``resets[0].site``)."""
    owner, path = f"the {subject}", ""
    for i, part in enumerate(loc):
        in_records = i > 0 and isinstance(loc[i - 1], int) and (i == 1 or loc[i - 2] == "records")
        if isinstance(part, str) and (i == 0 or in_records):
            # at the start: the record or frame; else an item of a list of records
            owner = f"the '{part}' {subject}" if i == 0 else f"record {loc[i - 1]} ('{part}')"
            path = ""
        elif isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return owner, path


def _more(text: str, others: int) -> str:
    if others <= 0:
        return text
    return f"{text} (and {others} more problem{'s' if others > 1 else ''})"


def _kind(value: Any) -> str:
    return _KINDS.get(type(value), type(value).__name__)


def _shown(value: Any) -> str:
    """A wrong value as the file holds it, cut short: ``"x"``, ``-1``, ``inf``, a list's
    length."""
    if isinstance(value, list | dict):
        return f"{_kind(value)} of {len(value)} item{'s' if len(value) != 1 else ''}"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= _SHOWN else text[:_SHOWN - 3] + "..."
