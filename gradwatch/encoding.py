"""The forms of protocol versions 2 and 3: index ranges, packed float arrays, implied values.

From version 2 a step leaves out what a reader can rebuild (see ``docs/design.md``,
"Versions") and packs what is bulky. This module owns both directions of each form, so the
writer (:mod:`gradwatch.wirejson`) and the reader (:func:`step_at_v1`, which the models of
:mod:`gradwatch.wire` call on a step of version 2 or later) cannot disagree. It imports nothing of
gradwatch.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
import sys
from array import array
from collections.abc import Sequence
from typing import Any

MAX_ITEMS = 100_000
"""The most indices an index list, and the most entries a packed array, may hold: the
wire's own bound on per-parameter lists, checked before anything is expanded."""

F32 = "f32:"
F64 = "f64:"
_LITTLE = sys.byteorder == "little"
_RANGE = re.compile(r"([0-9]{1,19})(?:-([0-9]{1,19}))?", re.ASCII)


class FormError(ValueError):
    """A version-2 form that cannot be read; the message says what is wrong with it."""


def implied_drift(norm: float | None, fresh_norm: float | None) -> float | None:
    """The drift a step implies: ``norm / fresh_norm``, None where either is unknown or
    nothing was fresh (``fresh_norm`` 0). The probe computes drift exactly this way, so a
    writer leaves a drift out when it equals this."""
    if norm is None or not fresh_norm:
        return None
    return norm / fresh_norm


def same(a: float | None, b: float | None) -> bool:
    """``a`` and ``b`` are the same value: equal bit for bit in meaning (NaN is NaN, -0.0 is
    not 0.0, None only None). What "left out when equal" compares with."""
    if a is None or b is None:
        return a is b
    if a != a:
        return b != b
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def same_list(a: Sequence[float | None] | None, b: Sequence[float | None] | None) -> bool:
    """:func:`same` for two lists (or None), entry by entry."""
    if a is None or b is None:
        return a is b
    if a is b:
        return True
    if len(a) != len(b):
        return False
    # Equal lists in C are the same unless a zero hides its sign; NaN takes the slow way.
    return (a == b and 0.0 not in a) or all(map(same, a, b))


def ranges(indices: Sequence[int]) -> str:
    """An index list as ranges: ``[0, 1, 2, 5]`` → ``"0-2,5"`` (order kept, so any list
    round-trips; runs are ascending steps of one)."""
    out: list[str] = []
    i, n = 0, len(indices)
    while i < n:
        start = indices[i]
        j = i
        while j + 1 < n and indices[j + 1] == indices[j] + 1:
            j += 1
        out.append(str(start) if j == i else f"{start}-{indices[j]}")
        i = j + 1
    return ",".join(out)


def expand(text: str) -> list[int]:
    """The index list ``text`` (as :func:`ranges` writes it) stands for.

    Raises:
        FormError: not ranges of non-negative integers, a range that runs backwards, or
            more than :data:`MAX_ITEMS` indices in all (counted before expanding).
    """
    if not text:
        return []
    lo_text, dash, hi_text = text.partition("-")
    if (lo_text.isdigit() and hi_text.isdigit() and text.isascii()
            and len(lo_text) <= 19 and len(hi_text) <= 19):
        # one range ("0-19", a whole optimizer's reset): the usual case, without the regex
        lo, hi = int(lo_text), int(hi_text)
        if lo <= hi and hi - lo < MAX_ITEMS:
            return list(range(lo, hi + 1))
    bounds: list[tuple[int, int]] = []
    total = 0
    for part in text.split(","):
        m = _RANGE.fullmatch(part)
        if m is None:
            raise FormError(f"{part[:40]!r} is not an index or a range of indices like "
                            f"'4-6'")
        lo = int(m[1])
        hi = int(m[2]) if m[2] else lo
        if hi < lo:
            raise FormError(f"the range {part!r} runs backwards")
        total += hi - lo + 1
        if total > MAX_ITEMS:
            raise FormError(f"the ranges hold more than {MAX_ITEMS} indices")
        bounds.append((lo, hi))
    out: list[int] = []
    for lo, hi in bounds:
        out.extend(range(lo, hi + 1))
    return out


def as_float32(x: float) -> float:
    """``x`` rounded to the nearest float32 (OverflowError: finite, past float32's range)."""
    return array("f", [x])[0]


def is_float32(values: Sequence[float]) -> bool:
    """Every value is exactly a float32 (NaN and infinities are)."""
    try:
        a = array("f", values).tolist()
    except OverflowError:  # a finite value past float32's range
        return False
    # A list compare runs in C; it fails on NaN (NaN != NaN), which the slow way settles.
    return a == values or all(map(same, a, values))


def pack(values: Sequence[float | None]) -> str:
    """Per-parameter floats as ``"f32:"`` (or ``"f64:"`` when a value is not exactly a
    float32, so nothing is rounded) and the base64 of little-endian IEEE floats, then
    ``"!"`` and the indices of missing (None) entries as :func:`ranges`. NaN and infinities
    are ordinary values."""
    missing = [i for i, x in enumerate(values) if x is None] if None in values else []
    filled: list[float] = ([0.0 if x is None else x for x in values] if missing
                           else values)  # type: ignore[assignment]
    kind = F32 if is_float32(filled) else F64
    a = array("f" if kind == F32 else "d", filled)
    if not _LITTLE:
        a.byteswap()
    text = kind + base64.b64encode(a.tobytes()).decode("ascii")
    return text + "!" + ranges(missing) if missing else text


def unpack(text: str) -> list[float | None]:
    """The floats :func:`pack` wrote, None where an entry is missing.

    Raises:
        FormError: not a packed array (kind, base64, length), over :data:`MAX_ITEMS`
            entries, or a missing index past its end.
    """
    kind, body = text[:4], text[4:]
    if kind not in (F32, F64):
        raise FormError("a packed array starts with 'f32:' or 'f64:'")
    body, _, missing_text = body.partition("!")
    width = 4 if kind == F32 else 8
    if len(body) * 3 // 4 > MAX_ITEMS * width + 3:
        raise FormError(f"a packed array holds at most {MAX_ITEMS} entries")
    try:
        raw = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError) as e:
        raise FormError(f"the packed array is not base64 ({e})") from None
    if len(raw) % width:
        raise FormError(f"the packed array's length is not a whole number of "
                        f"{width}-byte floats")
    a = array("f" if width == 4 else "d", raw)
    if not _LITTLE:
        a.byteswap()
    out: list[float | None] = a.tolist()  # type: ignore[assignment]
    for i in expand(missing_text):
        if i >= len(out):
            raise FormError(f"missing index {i} is past the array's {len(out)} entries")
        out[i] = None
    return out


FLOAT32_DIGITS = 9
"""Significant digits that tell every float32 from its neighbours."""


def at_float32_precision(x: float) -> float:
    """``x`` to :data:`FLOAT32_DIGITS` significant digits: what a quantity measured from
    float32 values (a norm of float32 gradients, a float32 loss) carries. Its shortest text
    (what a writer writes) has at most that many digits, where the float64 it is computed
    in has 17; a float32 value comes back exact when rounded to float32. NaN and infinities
    are kept."""
    return float(f"{x:.{FLOAT32_DIGITS}g}")


def nonfinite(v: Any) -> Any:
    """``v``, or the float a JSON string for NaN or an infinity stands for (``"NaN"``,
    ``"Infinity"``, ``"-Infinity"``: how non-finite numbers travel)."""
    if isinstance(v, str):
        low = v.strip().lower()
        if low in ("nan", "infinity", "+infinity", "-infinity", "inf", "-inf"):
            return float(low.replace("infinity", "inf"))
    return v


INDEX_LISTS = ("stale_params", "leaked_params", "late_params", "discarded_params")
"""A step's index lists (and each reset's ``params``): written as ranges."""
PACKED = ("param_norms", "param_fresh_norms", "lr")
"""A step's per-parameter (or per-group) floats: written packed."""
IMPLIED = {"fresh_norm": "norm", "param_fresh_norms": "param_norms"}
"""A step's fields left out when they equal the field named (``drift``: :func:`implied_drift`)."""
IMPLIED_V3 = {"fresh": "consumed"}
"""From version 3, also: ``fresh`` left out when it equals ``consumed`` (a clean step)."""
DEFAULTS_V3 = {"backwards": 1}
"""From version 3, a step's fields left out at these values instead of their defaults (a
clean step has one backward)."""


def step_at_v1(data: dict[str, Any], v: int) -> dict[str, Any]:
    """A step's JSON object written at version ``v`` (2 or later) as version 1 writes it:
    implied values filled in, ranges and packed arrays expanded; what is not a version-2
    form is left for the model to validate.

    Raises:
        FormError: a range or a packed array cannot be read; the message names the field.
    """
    # Every import and ingest runs this once a step: one pass over the fields present
    # (a clean step has few), not a lookup of every form.
    d = dict(data)
    k = ""
    try:
        for k, x in data.items():
            if x.__class__ is str:
                if k in _INDEX_SET:
                    d[k] = expand(x)
                elif k in _PACKED_SET:
                    d[k] = unpack(x)
            elif k == "resets" and x.__class__ is list:
                d[k] = [{**r, "params": expand(r["params"])}
                        if r.__class__ is dict and r.get("params").__class__ is str else r
                        for r in x]
    except FormError as e:
        raise FormError(f"{k}: {e}") from None
    for k, by in IMPLIED.items():
        if k not in d:
            same_as = d.get(by)
            d[k] = list(same_as) if same_as.__class__ is list else same_as
    if v >= 3:
        for k, by in IMPLIED_V3.items():
            if k not in d:
                d[k] = d.get(by, 0)
        for k, x in DEFAULTS_V3.items():
            d.setdefault(k, x)
    if "drift" not in d:
        norm, fresh = d.get("norm"), d["fresh_norm"]
        if norm.__class__ is not float or fresh.__class__ is not float:  # rare: the slow way
            norm, fresh = nonfinite(norm), nonfinite(fresh)
            if not (_is_number(norm) and _is_number(fresh)):
                return d
        d["drift"] = implied_drift(float(norm), float(fresh))
    return d


_INDEX_SET = frozenset(INDEX_LISTS)
_PACKED_SET = frozenset(PACKED)


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)
