"""The ``steps``, ``param_norms`` and ``step_agg`` columns: how steps and bucket summaries
are stored and read back.

:func:`step_columns` and :func:`step_record` are inverse: a step record goes into columns
(NaN norms as NULL plus a flag bit, per-parameter norms packed as float32 bytes where that
is exact, resets as one shared ``reset_sets`` row, a ``detail`` JSON for what no column
holds) and an export rebuilds a record equal in meaning to the one received. Shared by the
writer (:mod:`server.writes`, :mod:`server.chunks`) and the readers (:mod:`server.reader`,
:mod:`server.series_read`); it imports neither. The SQL forms of the row rules are
generated here from their Python homes and tests hold them equal: :data:`FACTS_SQL`
(:func:`gradwatch.verdict.carries_facts`) and :data:`MUST_KEEP_SQL`
(:func:`server.rows.must_keep`).
"""

from __future__ import annotations

import json
import math
import sys
from array import array
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from gradwatch.server.downsampling import Bucket
from gradwatch.server.rows import KEEP_NONFINITE, STEPS_COLUMNS, Row, StepCols
from gradwatch.verdict import FINDING_FACTS
from gradwatch.wire import Step

# SQLite stores NaN as NULL: a bit per float column says "this NULL was a NaN".
FLAG_NAN_NORM = 1
FLAG_NAN_FRESH = 2
FLAG_NAN_DRIFT = 4
FLAG_SKIPPED = 8
FLAG_FRESH_IS_NORM = 16
"""``fresh_norm`` equals ``norm`` (the usual clean step): its column is left NULL."""
FLAG_NAN_LOSS = 32
FLAG_PFRESH_IS_PNORM = 64
"""``param_fresh_norms`` equals ``param_norms``: ``param_norms.fresh`` is left NULL."""
NAN_BITS = {"norm": FLAG_NAN_NORM, "fresh_norm": FLAG_NAN_FRESH, "drift": FLAG_NAN_DRIFT,
            "loss": FLAG_NAN_LOSS}
"""The flag saying a float column's NULL was a NaN, by column."""
_NAN = float("nan")
_FLOAT_MAX = sys.float_info.max

_COLUMNS = ("norm", "fresh_norm", "drift", "skipped", "stale", "leaked",
            "discarded", "backwards", "consumed", "fresh", "closure_evals", "resets",
            "loss", "lr", "param_norms", "param_fresh_norms", "seq", "t", "opt", "step",
            "type")
"""Step fields the columns hold; every other non-default field goes to ``detail``."""
_DETAIL = tuple(f for f in Step.model_fields if f not in _COLUMNS)
_DEFAULTS = {f: Step.model_fields[f].get_default(call_default_factory=True) for f in _DETAIL}

STEPS_INSERT = f"INSERT INTO steps VALUES({','.join('?' * (1 + len(STEPS_COLUMNS)))})"
"""The writer's insert of ``steps`` rows (:meth:`~server.rows.StepCols.steps_values`)."""
PARAMS_INSERT = "INSERT INTO param_norms VALUES(?,?,?,?)"
"""The writer's insert of a step's per-parameter norms (sid, step, norms, fresh), after
its step's row."""

STEPS_FROM = ("FROM steps s JOIN series e ON e.sid=s.sid "
              "LEFT JOIN reset_sets z ON z.id=s.rset ")
STEP_SELECT = ("SELECT e.rank, e.opt, s.step, s.t, s.norm, "
               f"CASE WHEN (s.flags & {FLAG_FRESH_IS_NORM}) <> 0 THEN s.norm "
               "ELSE s.fresh_norm END, "
               "s.drift, s.flags, s.stale, s.leaked, s.late, s.discarded, z.summary, "
               "s.loss, s.lr " + STEPS_FROM)
"""Reads rows for :func:`to_row`; append the WHERE clause (``s.`` the steps)."""

FACTS_SQL = "(" + " OR ".join(
    f"{c} > 0" for c in ("stale", "leaked", "late", "discarded")) + ")"
"""A ``steps`` row carries a finding fact (the columns of :data:`FINDING_FACTS`)."""
assert len(FINDING_FACTS) == 4

MUST_KEEP_SQL = "(" + " OR ".join(
    [FACTS_SQL, f"(flags & {FLAG_SKIPPED}) <> 0"]
    + [f"(flags & {NAN_BITS[c]}) <> 0 OR abs({c}) > {_FLOAT_MAX!r}" for c in KEEP_NONFINITE]
) + ")"

if TYPE_CHECKING:
    from gradwatch.server.backend import Conn
"""A ``steps`` row a plot must never lose (an infinity is above the largest float; a NaN
is a NULL with its flag set)."""


def _nan(x: float | None) -> bool:
    return x is not None and x != x


def pack_norms(xs: list[float | None] | None) -> bytes | str | None:
    """Per-parameter norms as float32 bytes when that holds every value exactly, else as
    the wire's JSON text (float64 values, missing entries); None stays None.

    The text's length is never a multiple of 4 (a trailing space pads it), so where a
    column holds only bytes (PostgreSQL's ``bytea``) its bytes still tell the two apart.
    """
    if xs is None:
        return None
    try:
        a = array("f", xs)  # type: ignore[type-var]
    except (TypeError, OverflowError):  # a None entry, a value past float32
        return _padded(_json_norms(xs))
    if a.tolist() != xs and any(y != x and not (x != x and y != y)
                                for x, y in zip(xs, a.tolist(), strict=True)):
        return _padded(_json_norms(xs))
    return a.tobytes()


def _padded(text: str) -> str:
    return text + " " if len(text.encode()) % 4 == 0 else text


def unpack_norms(v: bytes | str | None) -> list[float | None] | None:
    """The inverse of :func:`pack_norms`."""
    if v is None:
        return None
    if isinstance(v, bytes) and len(v) % 4:  # JSON text stored as bytes (pack_norms)
        v = v.decode()
    if isinstance(v, bytes):
        a = array("f")
        a.frombytes(v)
        return a.tolist()  # type: ignore[return-value]
    return [_json_float(x) for x in json.loads(v)]


def _wire_float(x: float | None) -> Any:
    if x is None or math.isfinite(x):
        return x
    return "NaN" if x != x else ("Infinity" if x > 0 else "-Infinity")


def _json_float(x: Any) -> float | None:
    """A float read back from stored JSON, where NaN and infinities are strings."""
    if isinstance(x, str):
        return float(x.lower().replace("infinity", "inf"))
    return x


def _json_norms(xs: list[float | None]) -> str:
    try:
        if all(map(math.isfinite, xs)):  # type: ignore[arg-type]
            return "[" + ",".join(map(float.__repr__, xs)) + "]"
    except TypeError:  # a None entry
        pass
    return json.dumps([_wire_float(x) for x in xs], separators=(",", ":"))


_RESETS_SEEN: dict[tuple[Any, ...], tuple[str, str]] = {}


def resets_text(s: Step) -> tuple[str | None, str | None]:
    """A step's resets as a ``reset_sets`` body (JSON, defaults left out) and summary."""
    if not s.resets:
        return None, None
    key = tuple((r.how, *r.params, -1, r.discarded, r.after_backward, r.site)
                for r in s.resets)
    got = _RESETS_SEEN.get(key)
    if got is None:  # once per distinct set (a run's steps share a few)
        if len(_RESETS_SEEN) > 4096:
            _RESETS_SEEN.clear()
        got = _RESETS_SEEN[key] = _resets_text(s)
    return got


def _resets_text(s: Step) -> tuple[str, str]:
    out, summary = [], []
    for r in s.resets:
        d: dict[str, Any] = {"how": r.how, "params": r.params}
        if r.discarded:
            d["discarded"] = r.discarded
        if r.after_backward:
            d["after_backward"] = True
        if r.site is not None:
            d["site"] = r.site
        out.append(d)
        summary.append(f"{r.how}:{len(r.params)}")
    return json.dumps(out, separators=(",", ":")), ";".join(summary)


def step_columns(s: Step) -> StepCols:
    """The columns of one validated step record (inverse: :func:`step_record`)."""
    norm, fresh, drift, loss = s.norm, s.fresh_norm, s.drift, s.loss
    flags = (_nan(norm) * FLAG_NAN_NORM | _nan(fresh) * FLAG_NAN_FRESH
             | _nan(drift) * FLAG_NAN_DRIFT | _nan(loss) * FLAG_NAN_LOSS
             | s.skipped * FLAG_SKIPPED)
    if fresh is not None and fresh == norm:
        flags |= FLAG_FRESH_IS_NORM
        fresh = None
    pn, pf = s.param_norms, s.param_fresh_norms
    if pf is not None and pn is not None and pf == pn:
        flags |= FLAG_PFRESH_IS_PNORM
        pf = None
    detail: dict[str, Any] | None = None
    for f in _DETAIL:
        v = getattr(s, f)
        if v != _DEFAULTS[f]:
            if detail is None:
                detail = {}
            detail[f] = v.model_dump(exclude_defaults=True) if hasattr(v, "model_dump") \
                else v
    rs, summary = resets_text(s)
    return StepCols(
        step=s.step, seq=s.seq, t=s.t, norm=None if flags & FLAG_NAN_NORM else norm,
        fresh_norm=None if flags & FLAG_NAN_FRESH else fresh,
        drift=None if flags & FLAG_NAN_DRIFT else drift, flags=flags, stale=s.stale,
        leaked=s.leaked, late=len(s.late_params), discarded=s.discarded,
        backwards=s.backwards, consumed=s.consumed, fresh=s.fresh,
        closure_evals=s.closure_evals, rset=None,
        loss=None if flags & FLAG_NAN_LOSS else loss,
        lr=None if s.lr is None else _json_norms(s.lr),
        detail=None if detail is None else json.dumps(detail, separators=(",", ":")),
        resets=rs, summary=summary, params=pack_norms(pn), pfresh=pack_norms(pf))


RECORD_SELECT = ("SELECT s.seq, s.t, s.step, s.norm, s.fresh_norm, s.drift, s.flags, "
                 "s.stale, s.leaked, s.discarded, s.backwards, s.consumed, s.fresh, "
                 "s.closure_evals, z.body, s.loss, s.lr, s.detail, p.norms, p.fresh "
                 "FROM steps s LEFT JOIN reset_sets z ON z.id=s.rset "
                 "LEFT JOIN param_norms p ON p.sid=s.sid AND p.step=s.step ")
"""Reads what :func:`step_record` takes (after the optimizer's name); append WHERE."""


def step_record(opt: str, t: tuple[Any, ...]) -> dict[str, Any]:
    """The fields of a step record, from :data:`RECORD_SELECT` columns (non-finite floats
    as floats; :class:`~gradwatch.wire.Step` validates them as received)."""
    (seq, time, step, norm, fresh, drift, flags, stale, leaked, discarded, backwards,
     consumed, nfresh, closure, resets, loss, lr, detail, pn, pf) = t
    d: dict[str, Any] = {"type": "step", "seq": seq, "t": time, "opt": opt, "step": step}
    if flags & FLAG_SKIPPED:
        d["skipped"] = True
    for k, v in (("closure_evals", closure), ("backwards", backwards),
                 ("consumed", consumed), ("fresh", nfresh), ("stale", stale),
                 ("leaked", leaked), ("discarded", discarded)):
        if v:
            d[k] = v
    if resets is not None:
        d["resets"] = json.loads(resets)
    norm = _NAN if flags & FLAG_NAN_NORM else norm
    d["norm"] = norm
    d["fresh_norm"] = (norm if flags & FLAG_FRESH_IS_NORM
                       else _NAN if flags & FLAG_NAN_FRESH else fresh)
    d["drift"] = _NAN if flags & FLAG_NAN_DRIFT else drift
    pnorms = unpack_norms(pn)
    d["param_norms"] = pnorms
    d["param_fresh_norms"] = pnorms if flags & FLAG_PFRESH_IS_PNORM else unpack_norms(pf)
    if loss is not None or flags & FLAG_NAN_LOSS:
        d["loss"] = _NAN if flags & FLAG_NAN_LOSS else loss
    if lr is not None:
        d["lr"] = [_json_float(x) for x in json.loads(lr)]
    if detail is not None:
        d.update(json.loads(detail))
    return d


def row_of(rank: int, opt: str, c: StepCols) -> Row:
    """The row of a step from its columns (:func:`step_columns`): equal to the row read
    off the record's fields (a test holds them so)."""
    fresh = c.norm if c.flags & FLAG_FRESH_IS_NORM else c.fresh_norm
    return _row(rank, opt, c.step, c.t, c.norm, fresh, c.drift, c.flags, c.stale, c.leaked,
                c.late, c.discarded, c.summary, c.loss, c.lr)


def to_row(t: tuple[Any, ...]) -> Row:
    """A row as :data:`STEP_SELECT` reads it, as a :class:`Row` (NaN restored)."""
    return _row(*t)


def _row(rank: int, opt: str, step: int, t: float, norm: float | None,
         fresh: float | None, drift: float | None, flags: int, stale: int, leaked: int,
         late: int, discarded: int, resets: str | None, loss: float | None,
         lr: str | None) -> Row:
    """A :class:`Row` from stored values: NaN where its flag says so (SQLite stores NULL)."""
    return Row(rank, opt, step, t, _NAN if flags & FLAG_NAN_NORM else norm,
               _NAN if flags & FLAG_NAN_FRESH else fresh,
               _NAN if flags & FLAG_NAN_DRIFT else drift,
               stale, leaked, late, discarded, bool(flags & FLAG_SKIPPED), resets_of(resets),
               _NAN if flags & FLAG_NAN_LOSS else loss, _lr_of(lr))


@lru_cache(maxsize=256)
def _lr_of(text: str | None) -> tuple[float | None, ...] | None:
    """Learning rates as :func:`_json_norms` stored them (a run's few values repeat)."""
    return None if text is None else tuple(_json_float(x) for x in json.loads(text))


@lru_cache(maxsize=4096)
def resets_of(text: str | None) -> tuple[tuple[str, int], ...]:
    """A ``reset_sets.summary`` (``how:n;how:n``) as (how, n) pairs."""
    if not text:
        return ()
    out = []
    for part in text.split(";"):
        how, _, n = part.partition(":")
        out.append((how, int(n)))
    return tuple(out)


def read_rows(conn: Conn, sid: int, lo: int, hi: int) -> list[Row]:
    """Step rows of one series with ``lo <= step <= hi``, in step order."""
    cur = conn.execute(STEP_SELECT + "WHERE s.sid=? AND s.step BETWEEN ? AND ? "
                       "ORDER BY s.step", (sid, lo, hi))
    return [to_row(t) for t in cur]


AGG_INSERT = "INSERT OR REPLACE INTO step_agg VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
"""The writer's row of a chunk summary: (sid, chunk, *:func:`agg_values`)."""
AGG_SELECT = ("SELECT chunk, mn_norm, mn_norm_step, mx_norm, mx_norm_step, mn_drift, "
              "mn_drift_step, mx_drift, mx_drift_step, flag_step, sig FROM step_agg ")
"""Reads chunk summaries for :func:`bucket_of`; append the WHERE clause."""


def agg_values(b: Bucket, n: int) -> tuple[Any, ...]:
    """The ``step_agg`` values after the key (sid, chunk) of a chunk's bucket."""
    out: list[Any] = [n]
    for x in (b.lo_norm, b.hi_norm, b.lo_drift, b.hi_drift):
        out += [None, None] if x is None else list(x)
    return (*out, b.flag, b.odd(), json.dumps(b.sigs, separators=(",", ":")))


def bucket_of(t: tuple[Any, ...]) -> tuple[int, Bucket]:
    """A chunk summary as :data:`AGG_SELECT` reads it: its chunk and its bucket."""
    b = Bucket()
    b.lo_norm = None if t[1] is None else (t[1], t[2])
    b.hi_norm = None if t[3] is None else (t[3], t[4])
    b.lo_drift = None if t[5] is None else (t[5], t[6])
    b.hi_drift = None if t[7] is None else (t[7], t[8])
    b.flag = t[9]
    b.sigs = json.loads(t[10])
    return t[0], b
