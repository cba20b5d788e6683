"""Records as JSON lines at the current protocol version (:data:`~gradwatch.wire.PROTOCOL_VERSION`).

A step is written in the forms of versions 2 and 3 (:mod:`gradwatch.encoding`): defaults
and implied values left out, index lists as ranges, per-parameter arrays packed. Every
other record is written whole, as version 1 wrote it, with its header saying the current
version. :func:`dump_record` is the one entry point; this module imports :mod:`gradwatch.wire`,
never the other way round.

Two writers of a step, one text: :class:`ObjectJson` walks any model's fields (the reference,
and what a field added later falls back to); :func:`step_text` is the probe writer
thread's unrolled copy for the fields known today, held equal to it by tests.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from pydantic import BaseModel

from gradwatch import encoding
from gradwatch.wire import Reset, Step, StepSites

_Field = tuple[type[BaseModel], str]
_RANGES: set[_Field] = {(Step, k) for k in encoding.INDEX_LISTS} | {(Reset, "params")}
_PACKED: set[_Field] = {(Step, k) for k in encoding.PACKED}
_IMPLIED: dict[_Field, str] = {(Step, k): by for k, by in
                               {**encoding.IMPLIED, **encoding.IMPLIED_V3}.items()}
_DEFAULTS: dict[_Field, Any] = {(Step, k): x for k, x in encoding.DEFAULTS_V3.items()}
"""Fields left out at a value other than the model's default."""
_COMPACT = (Step, Reset, StepSites)
"""Models written in the compact forms (defaults left out); the others are written whole."""
_str = json.JSONEncoder(ensure_ascii=False).encode
_name = functools.lru_cache(maxsize=1024)(_str)
"""An optimizer's name as JSON: a step of it is written every step."""
_UNSET = object()


def num(x: float) -> str:
    """A float as JSON: the shortest text that reads back exactly; NaN and infinities as
    the strings the models read back."""
    if x - x == 0.0:  # finite
        return repr(float(x))
    if x != x:
        return '"NaN"'
    return '"Infinity"' if x > 0 else '"-Infinity"'


_SHORT = 4
"""Float lists this long or shorter are written as a JSON list where that is shorter than
packed (one learning rate: ``[0.1]``, not ``"f64:mpmZmZmZuT8="``)."""


def floats_text(xs: list[float | None]) -> str:
    """A per-parameter (or per-group) float list since version 2: packed
    (:func:`gradwatch.encoding.pack`), or a plain JSON list when it has at most
    :data:`_SHORT` entries and that is no longer. Readers take either."""
    if len(xs) > _SHORT:
        return '"' + encoding.pack(xs) + '"'
    plain = "[" + ",".join("null" if x is None else num(x) for x in xs) + "]"
    if len(plain) <= 6 + 4 * -(-4 * len(xs) // 3):  # the shortest packing: quoted f32
        return plain  # (a step's one learning rate, packed or not: no packing made)
    packed = '"' + encoding.pack(xs) + '"'
    return plain if len(plain) <= len(packed) else packed


def _value(x: Any) -> str:
    if x is None:
        return "null"
    if x is True:
        return "true"
    if x is False:
        return "false"
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        return num(x)
    if isinstance(x, str):
        return _str(x)
    if isinstance(x, BaseModel):
        return ObjectJson.encode(x)
    if isinstance(x, dict):
        return "{" + ",".join(f"{_str(k)}:{_value(v)}" for k, v in x.items()) + "}"
    return "[" + ",".join(map(_value, x)) + "]"


_MODEL_DEFAULTS: dict[_Field, Any] = {}


def _model_default(cls: type[BaseModel], name: str, field: Any) -> Any:
    """A field's default, made once: pydantic inspects a default factory's signature at
    every call (about 0.4 ms), and the wire models' factories make empty containers, which
    the encoder only compares."""
    key = (cls, name)
    if key not in _MODEL_DEFAULTS:
        _MODEL_DEFAULTS[key] = field.get_default(call_default_factory=True)
    return _MODEL_DEFAULTS[key]


class ObjectJson:
    """The generic encoder: walks a model's fields in order and applies the compact forms
    by the tables above."""

    @staticmethod
    def encode(model: BaseModel) -> str:
        """``model`` (a record or a part of one) as JSON at the current version."""
        cls = type(model)
        if not isinstance(model, _COMPACT):
            return model.model_dump_json()
        values = model.__dict__
        parts: list[str] = []
        for name, field in cls.model_fields.items():
            x = values[name]
            implied_by = _IMPLIED.get((cls, name))
            if implied_by is not None:
                other = values[implied_by]
                if (encoding.same_list(x, other) if isinstance(x, list | None) and
                        isinstance(other, list | None) else encoding.same(x, other)):
                    continue
            elif cls is Step and name == "drift":
                if encoding.same(x, encoding.implied_drift(values["norm"],
                                                           values["fresh_norm"])):
                    continue
            elif name != "type" and not field.is_required():
                default = _DEFAULTS.get((cls, name), _UNSET)
                if default is _UNSET:
                    default = _model_default(cls, name, field)
                if x == default and type(x) is type(default):
                    continue
            if (cls, name) in _RANGES:
                text = _str(encoding.ranges(x))
            elif (cls, name) in _PACKED and x is not None:
                text = floats_text(x)
            else:
                text = _value(x)
            parts.append(f'"{name}":{text}')
        return "{" + ",".join(parts) + "}"


def dump_record(record: BaseModel) -> str:
    """Any record as one JSON line (no trailing newline) at the current protocol version:
    the one serialiser of records (step logs, spools, exports)."""
    if type(record) is Step:
        return step_text(record)
    return ObjectJson.encode(record)


STEP_FIELDS = frozenset(Step.model_fields)
"""The fields :func:`step_text` writes itself; a step with others goes to the generic encoder."""
_RESET_FIELDS = frozenset(Reset.model_fields)


def step_text(s: Step) -> str:
    """A step as :meth:`ObjectJson.encode` writes it, field by field without the walk: the
    probe's writer thread writes one per optimizer step."""
    d = s.__dict__
    if d.keys() != STEP_FIELDS:  # a field this copy does not know: the reference writes
        return ObjectJson.encode(s)
    out = [f'{{"seq":{d["seq"]},"t":{num(d["t"])},"type":"step","opt":{_name(d["opt"])},'
           f'"step":{d["step"]}']
    if d["skipped"]:
        out.append('"skipped":true')
    if d["closure_evals"]:
        out.append(f'"closure_evals":{d["closure_evals"]}')
    if d["backwards"] != 1:
        out.append(f'"backwards":{d["backwards"]}')
    if d["consumed"]:
        out.append(f'"consumed":{d["consumed"]}')
    if d["fresh"] != d["consumed"]:
        out.append(f'"fresh":{d["fresh"]}')
    for k in ("stale", "leaked"):
        if d[k]:
            out.append(f'"{k}":{d[k]}')
    for k in ("stale_params", "leaked_params", "late_params"):
        if d[k]:
            out.append(f'"{k}":"{encoding.ranges(d[k])}"')
    if d["discarded"]:
        out.append(f'"discarded":{d["discarded"]}')
    if d["discarded_params"]:
        out.append(f'"discarded_params":"{encoding.ranges(d["discarded_params"])}"')
    if d["resets"]:
        out.append('"resets":[' + ",".join(map(_reset_text, d["resets"])) + "]")
    norm, fresh_norm, drift = d["norm"], d["fresh_norm"], d["drift"]
    if norm is not None:
        out.append(f'"norm":{num(norm)}')
    if fresh_norm is not norm and not encoding.same(fresh_norm, norm):
        out.append(f'"fresh_norm":{_opt_num(fresh_norm)}')
    if not encoding.same(drift, encoding.implied_drift(norm, fresh_norm)):
        out.append(f'"drift":{_opt_num(drift)}')
    per, fresh = d["param_norms"], d["param_fresh_norms"]
    if per is not None:
        out.append(f'"param_norms":{floats_text(per)}')
    if fresh is not per and not encoding.same_list(fresh, per):
        out.append('"param_fresh_norms":' + ("null" if fresh is None
                                             else floats_text(fresh)))
    if d["sites"] is not None:
        out.append('"sites":' + ObjectJson.encode(d["sites"]))
    if d["loss"] is not None:
        out.append(f'"loss":{num(d["loss"])}')
    if d["lr"] is not None:
        out.append(f'"lr":{floats_text(d["lr"])}')
    return ",".join(out) + "}"


def _opt_num(x: float | None) -> str:
    return "null" if x is None else num(x)


def _reset_text(r: Reset) -> str:
    d = r.__dict__
    if d.keys() != _RESET_FIELDS:
        return ObjectJson.encode(r)
    text = f'{{"how":"{d["how"]}"'
    if d["params"]:
        text += f',"params":"{encoding.ranges(d["params"])}"'
    if d["discarded"]:
        text += f',"discarded":{d["discarded"]}'
    if d["after_backward"]:
        text += ',"after_backward":true'
    if d["site"] is not None:
        text += f',"site":{d["site"]}'
    return text + "}"
