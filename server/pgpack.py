"""How PostgreSQL keeps steps: packed, one row per chunk of a series (schema 6).

A row per step, as SQLite keeps it, costs PostgreSQL a tuple header, a line pointer and an
index entry each in ``steps`` and ``param_norms``, and fixed-width integers: more than
twice SQLite's bytes per step. So once a chunk (:data:`server.db.CHUNK` steps of one
series) is summarised, its rows move into one ``step_packs`` row of column arrays, which
PostgreSQL compresses (TOAST); what a pack can derive it does not store (a full chunk's
steps, ``seq`` beyond its offset from ``step``), and its per-parameter norms are one byte
string when every step's are as long (an array of byte strings costs 4 bytes a step).
The open chunk's rows stay one per step in ``step_rows`` (a step's per-parameter norms in
its row: one table and one index for the open rows), where the writer inserts them;
``steps`` and ``param_norms`` are views of both, so a statement reading whole series runs
unchanged.

Reads of a step range must not unpack a whole series, so :func:`packed_form` writes the
storage modules' range statements over functions that visit only the chunks in range
(``gw_steps_in``, ``gw_steps_at``, ``gw_first_step`` ...): the statements' text and their
parameters stay the storage modules' own, in the same order. Moving a summarised chunk
is ``gw_put_agg``, the ``step_agg`` upsert that also packs the chunk, merging any rows it
packed before (a resent gap) and stored open; the batch's rows of the chunk it is given
as arrays (:class:`server.pgheld.HeldRows`), so they never enter ``step_rows`` to leave
dead rows there. Only :mod:`server.pgdb`,
:mod:`server.pgheld` and :mod:`server.pgschema` import this module.
"""

from __future__ import annotations

import re

from gradwatch.server.db import CHUNK
from gradwatch.server.rows import STEPS_COLUMNS
from gradwatch.server.series_read import SPAN
from gradwatch.server.steptable import AGG_INSERT, PARAMS_INSERT, STEPS_INSERT

_TYPES = {"t": "DOUBLE PRECISION", "norm": "DOUBLE PRECISION",
          "fresh_norm": "DOUBLE PRECISION", "drift": "DOUBLE PRECISION", "flags": "INTEGER",
          "loss": "DOUBLE PRECISION", "lr": "TEXT", "detail": "TEXT"}
STEP_COLUMNS = tuple((c, _TYPES.get(c, "BIGINT")) for c in STEPS_COLUMNS)
"""The columns of a ``steps`` row after ``sid``, in order, with their types (schema 4's
table; the others are BIGINT)."""
PARAM_COLUMNS = (("pstep", "step", "BIGINT"), ("pnorms", "norms", "BYTEA"),
                 ("pfresh", "fresh", "BYTEA"))
"""``step_packs`` arrays of the ``param_norms`` rows: (array, column, type)."""

_STEP_NAMES = ", ".join(c for c, _ in STEP_COLUMNS)
_STEP_ARRAYS = ", ".join(f"p.{c}" for c, _ in STEP_COLUMNS)


def _every_step(chunk: str) -> str:
    """Every step of the chunk ``chunk`` (an SQL expression) as an array."""
    return f"ARRAY(SELECT generate_series({chunk} * {CHUNK}, {chunk} * {CHUNK} + {CHUNK - 1}))"


_ALL = f"coalesce(p.step, {_every_step('p.chunk')})"
"""A pack's steps: its ``step`` array is NULL when they are every step of the chunk (the
usual case), derived here."""
_STEP = f"coalesce(u.step, p.chunk * {CHUNK} + u.i - 1)"
"""A packed row's step: its place in the chunk when the pack's ``step`` is NULL."""
_PSTEP = f"coalesce(p.pstep, {_ALL})"
"""A pack's steps with per-parameter norms: ``pstep`` is NULL when they are all its
steps (the usual case), ``{}`` when none."""
_PARAM_ARRAYS = f"{_PSTEP}, coalesce(p.pnorms, gw_split(p.pblob, cardinality({_PSTEP}))), p.pfresh"
"""``pblob``: the per-parameter norms of a pack as one byte string when every step's are
there and as long (the usual case), in place of ``pnorms``' array."""
_HAS = "(p.pnorms IS NOT NULL OR p.pblob IS NOT NULL)"
"""Whether a pack holds per-parameter norms."""
_OPEN_STEPS = f"SELECT sid, {_STEP_NAMES} FROM step_rows WHERE "
_OPEN_PARAMS = ("SELECT sid, step, pnorms AS norms, pfresh AS fresh FROM step_rows "
                "WHERE pkept AND ")
"""The open chunks' rows of ``steps`` / ``param_norms`` (a condition to follow)."""
_PACKED_STEPS = (
    f"SELECT p.sid, {_STEP} AS step, {_STEP} + coalesce(u.seq, p.dseq) AS seq, "
    + ", ".join(f"u.{c}" for c, _ in STEP_COLUMNS[2:])
    + f" FROM step_packs p CROSS JOIN LATERAL unnest({_STEP_ARRAYS}) WITH ORDINALITY"
    f" AS u({_STEP_NAMES}, i)")
_PACKED_PARAMS = ("SELECT p.sid, u.* FROM step_packs p CROSS JOIN LATERAL "
                  f"unnest({_PARAM_ARRAYS}) AS u(step, norms, fresh)")
_MAX = 9223372036854775807


def _ends(where: str, array: str, has: str, fn: str, agg: str, order: str) -> str:
    """A function giving the first (or last) step of a series in [lo, hi]: from the
    open rows' index and the first (last) two packs in range (the one at ``lo``'s chunk
    may hold only steps below ``lo``; every step of the next is in range but for
    ``hi``'s chunk, past which no pack is in range)."""
    return f"""
CREATE FUNCTION {fn}(s BIGINT, lo BIGINT, hi BIGINT) RETURNS BIGINT LANGUAGE sql STABLE AS $$
  SELECT {agg}(x) FROM (
    (SELECT step AS x FROM step_rows WHERE {where}sid = s AND step BETWEEN lo AND hi
     ORDER BY step {order} LIMIT 1)
    UNION ALL
    (SELECT {agg}(u) FROM (SELECT {array} AS a FROM step_packs p WHERE sid = s AND chunk
      BETWEEN lo / {CHUNK} AND hi / {CHUNK} AND {has} ORDER BY chunk {order} LIMIT 2) p
     CROSS JOIN LATERAL unnest(p.a) u WHERE u BETWEEN lo AND hi)) q $$;"""


def _reads(view: str, rows_of: str, packed: str) -> str:
    """The functions reading one series' rows of ``view`` in a step range (``_in``) and
    at listed steps (``_at``): the open rows by their index, the packs of those chunks."""
    out = ""
    for fn, args, rows, chunks in (
            ("in", "lo BIGINT, hi BIGINT", "BETWEEN lo AND hi",
             f"BETWEEN lo / {CHUNK} AND hi / {CHUNK}"),
            ("at", "VARIADIC at BIGINT[]", "= ANY(at)",
             f"IN (SELECT x / {CHUNK} FROM unnest(at) x)")):
        out += f"""
CREATE FUNCTION gw_{view}_{fn}(s BIGINT, {args}) RETURNS SETOF {view}
LANGUAGE sql STABLE AS $$
  {rows_of}sid = s AND step {rows}
  UNION ALL SELECT * FROM ({packed} WHERE p.sid = s AND p.chunk {chunks}) q
  WHERE step {rows}
$$;"""
    return out


def _agg(column: str, name: str | None = None) -> str:
    """A column of rows as a pack's array in step order; NULL where every value is (but
    ``pnorms``, whose NULL says no row was kept)."""
    agg = f"array_agg({column} ORDER BY step)"
    if name != "pnorms":
        agg = f"CASE WHEN count({column}) = 0 THEN NULL ELSE {agg} END"
    return f"{agg} AS {name or column}"


_R_STEPS = ", ".join(f"r_{c}" for c, _ in STEP_COLUMNS)
_R_ARGS = ", ".join([_R_STEPS] + [f"r_{a}" for a, _, _ in PARAM_COLUMNS])
_R_PARAMS = ", ".join([f"r_{c} {t}[]" for c, t in STEP_COLUMNS]
                      + [f"r_{a} {t}[]" for a, _, t in PARAM_COLUMNS])


def put_pack() -> str:
    """``gw_put_pack``: store one chunk's rows (its columns as arrays in step order) as
    its pack, replacing any: ``step`` NULL when every step of the chunk is there (``{}``
    when none is), ``seq`` as seq - step, NULL and ``dseq`` when that is one value.

    PL/pgSQL, not SQL: a session plans its statement once, where an SQL function's
    statement is parsed and planned again at every call (the most of its time, packing
    a chunk per call)."""
    return f"""
CREATE OR REPLACE FUNCTION gw_put_pack(s BIGINT, c BIGINT, {_R_PARAMS}) RETURNS VOID
LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO step_packs SELECT s, c, CASE WHEN k.one THEN k.d[1] END,
    CASE WHEN r_step IS NULL THEN '{{}}' WHEN r_step = {_every_step('c')} THEN NULL ELSE r_step END,
    CASE WHEN k.one THEN NULL ELSE k.d END,
    {", ".join(f"r_{c}" for c, _ in STEP_COLUMNS[2:])},
    CASE WHEN r_pnorms IS NULL THEN '{{}}' WHEN r_pstep = r_step THEN NULL
    ELSE r_pstep END, CASE WHEN n.even THEN NULL ELSE r_pnorms END, r_pfresh,
    CASE WHEN n.even THEN n.blob END
  FROM (SELECT count(*) > 0 AND count(*) = count(x) AND count(DISTINCT length(x)) = 1
    AS even, string_agg(x, ''::BYTEA ORDER BY i) AS blob
    FROM unnest(r_pnorms) WITH ORDINALITY AS w(x, i)) n,
  (SELECT d, (SELECT count(DISTINCT x) = 1 FROM unnest(d) x) AS one FROM
    (SELECT ARRAY(SELECT q - v FROM unnest(r_seq, r_step) WITH ORDINALITY AS u(q, v, i)
     ORDER BY i) AS d) z) k
  ON CONFLICT (sid, chunk) DO UPDATE SET dseq = EXCLUDED.dseq,
    {", ".join(f"{c} = EXCLUDED.{c}" for c, _ in STEP_COLUMNS)},
    {", ".join(f"{a} = EXCLUDED.{a}" for a, _, _ in PARAM_COLUMNS)}, pblob = EXCLUDED.pblob;
END $$;"""


SCHEMA_6 = f"""
ALTER TABLE steps RENAME TO step_rows;
ALTER INDEX steps_pkey RENAME TO step_rows_pkey;
-- the open chunks' param_norms rows are columns of their steps' rows: one table, one
-- index (pkept: the step has them)
ALTER TABLE step_rows ADD COLUMN pkept BOOLEAN NOT NULL DEFAULT FALSE,
  ADD COLUMN pnorms BYTEA, ADD COLUMN pfresh BYTEA;
UPDATE step_rows r SET pkept = TRUE, pnorms = p.norms, pfresh = p.fresh
  FROM param_norms p WHERE p.sid = r.sid AND p.step = r.step;
DROP TABLE param_norms;
CREATE TABLE step_packs(
  sid BIGINT, chunk BIGINT, dseq BIGINT,
  {", ".join(f"{c} {t}[]" for c, t in STEP_COLUMNS)},
  {", ".join(f"{a} {t}[]" for a, _, t in PARAM_COLUMNS)},
  pblob BYTEA, PRIMARY KEY(sid, chunk));
-- step_packs: the steps of one summarised chunk (chunk = step / {CHUNK}), each column an
-- array in step order, but step NULL when they are every step of the chunk, and seq
-- holding seq - step, NULL when that is the same at every step: dseq; pstep/pnorms/pfresh:
-- its param_norms rows (pstep NULL: at every step; '{{}}' and pnorms NULL: none kept),
-- pblob: pnorms as one byte string (pnorms NULL) when its values are all as long.
CREATE FUNCTION gw_split(b BYTEA, n BIGINT) RETURNS BYTEA[] LANGUAGE plpgsql IMMUTABLE
STRICT AS $$
DECLARE
  whole BYTEA := b;  -- fetched from TOAST once, not once per slice
  w BIGINT := length(b) / n;
BEGIN
  RETURN ARRAY(SELECT substring(whole FROM i * w + 1 FOR w) FROM generate_series(0, n - 1) i
               ORDER BY i);
END $$;
CREATE VIEW steps AS {_OPEN_STEPS}TRUE UNION ALL {_PACKED_STEPS};
CREATE VIEW param_norms AS {_OPEN_PARAMS}TRUE UNION ALL {_PACKED_PARAMS};
{_reads("steps", _OPEN_STEPS, _PACKED_STEPS)}
{_reads("param_norms", _OPEN_PARAMS, _PACKED_PARAMS)}
{_ends("", _ALL, "TRUE", "gw_first_step", "min", "")}
{_ends("", _ALL, "TRUE", "gw_last_step", "max", "DESC")}
{put_pack()}
{_ends("pkept AND ", _PSTEP, _HAS, "gw_first_param", "min", "")}
{_ends("pkept AND ", _PSTEP, _HAS, "gw_last_param", "max", "DESC")}
-- gw_pack: the chunk's rows (open, packed, and any given as arrays) packed as one
CREATE FUNCTION gw_pack(s BIGINT, c BIGINT,
    {", ".join(f"{x} DEFAULT NULL" for x in _R_PARAMS.split(", "))}) RETURNS VOID
LANGUAGE plpgsql AS $$
DECLARE
  lo BIGINT := c * {CHUNK};
  hi BIGINT := c * {CHUNK} + {CHUNK - 1};
BEGIN
  IF r_step IS NULL
     AND NOT EXISTS (SELECT 1 FROM step_rows WHERE sid = s AND step BETWEEN lo AND hi) THEN
    RETURN;
  END IF;
  PERFORM gw_put_pack(s, c, {", ".join(f"a.{c}" for c, _ in STEP_COLUMNS)},
    {", ".join(f"b.{a}" for a, _, _ in PARAM_COLUMNS)}) FROM
    (SELECT {", ".join(_agg(c) for c, _ in STEP_COLUMNS)}
     FROM (SELECT * FROM gw_steps_in(s, lo, hi) UNION ALL SELECT s, u.* FROM
       unnest({_R_STEPS}) AS u({_STEP_NAMES})) q) a,
    (SELECT {", ".join(_agg(c, a) for a, c, _ in PARAM_COLUMNS)}
     FROM (SELECT * FROM gw_param_norms_in(s, lo, hi) UNION ALL SELECT s, v.* FROM
       unnest(r_pstep, r_pnorms, r_pfresh) AS v(step, norms, fresh)) q) b;
  DELETE FROM step_rows WHERE sid = s AND step BETWEEN lo AND hi;
END $$;
CREATE FUNCTION gw_put_agg(s BIGINT, c BIGINT, k BIGINT, a DOUBLE PRECISION, a_s BIGINT,
    b DOUBLE PRECISION, b_s BIGINT, d DOUBLE PRECISION, d_s BIGINT, e DOUBLE PRECISION,
    e_s BIGINT, f BIGINT, o BIGINT, g TEXT,
    {_R_PARAMS}) RETURNS VOID
LANGUAGE plpgsql AS $$
DECLARE
  lo BIGINT := c * {CHUNK};
  hi BIGINT := c * {CHUNK} + {CHUNK - 1};
BEGIN
  INSERT INTO step_agg VALUES(s, c, k, a, a_s, b, b_s, d, d_s, e, e_s, f, o, g)
  ON CONFLICT (sid, chunk) DO UPDATE SET n = EXCLUDED.n, mn_norm = EXCLUDED.mn_norm,
    mn_norm_step = EXCLUDED.mn_norm_step, mx_norm = EXCLUDED.mx_norm,
    mx_norm_step = EXCLUDED.mx_norm_step, mn_drift = EXCLUDED.mn_drift,
    mn_drift_step = EXCLUDED.mn_drift_step, mx_drift = EXCLUDED.mx_drift,
    mx_drift_step = EXCLUDED.mx_drift_step, flag_step = EXCLUDED.flag_step,
    odd_step = EXCLUDED.odd_step, sig = EXCLUDED.sig;
  IF r_step IS NOT NULL THEN
    IF NOT EXISTS (SELECT 1 FROM step_rows WHERE sid = s AND step BETWEEN lo AND hi)
       AND NOT EXISTS (SELECT 1 FROM step_packs WHERE sid = s AND chunk = c) THEN
      -- the whole chunk came in this batch: packed without passing through step_rows
      PERFORM gw_put_pack(s, c, {_R_ARGS});
      RETURN;
    END IF;
  END IF;
  -- merged with the chunk's rows stored before: the batch's never enter step_rows
  PERFORM gw_pack(s, c, {_R_ARGS});
END $$;
CREATE FUNCTION gw_forget(s BIGINT) RETURNS VOID LANGUAGE sql AS $$
  DELETE FROM step_rows WHERE sid = s;
  DELETE FROM step_packs WHERE sid = s;
$$;
-- every chunk summarised so far is packed, as the writer would have
SELECT gw_pack(sid, chunk) FROM step_agg ORDER BY sid, chunk;
"""
"""Schema 5 to 6 (:data:`server.pgschema.MIGRATIONS`): the tables, views and functions
above, and every summarised chunk of a schema-5 database packed."""

PACKS = "SELECT gw_put_agg("
"""How a statement that packs a chunk begins (in PostgreSQL's form)."""
HOT_TABLES = ("step_rows",)
"""Where the open chunks' rows come and go: the vacuum after packing keeps them small."""

_PARAM_INSERT = ("INSERT INTO step_rows(sid, step, seq, flags, pkept, pnorms, pfresh) "
                 "VALUES(?, ?, 0, 0, TRUE, ?, ?) ON CONFLICT (sid, step) DO UPDATE SET "
                 "pkept = TRUE, pnorms = EXCLUDED.pnorms, pfresh = EXCLUDED.pfresh")
"""The writer's insert of a step's per-parameter norms: into its step's row, stored
before it (in a transaction, :class:`server.pgheld.HeldRows` holds both)."""

_EXACT = {
    STEPS_INSERT: STEPS_INSERT.replace(" steps ", " step_rows ", 1),
    PARAMS_INSERT: _PARAM_INSERT,
    # the summary's values, then the chunk's held rows as arrays (server.pgheld)
    AGG_INSERT: PACKS + AGG_INSERT.partition("VALUES(")[2][:-1] + "," + ",".join(
        [f"?::{t}[]" for _, t in STEP_COLUMNS] + [f"?::{t}[]" for _, _, t in PARAM_COLUMNS])
    + ")",
    "DELETE FROM steps WHERE sid=?": "SELECT gw_forget(?)",
    "DELETE FROM param_norms WHERE sid=?": "SELECT gw_forget(?)",
    "SELECT max(step) FROM steps WHERE sid=?": f"SELECT gw_last_step(?, -1, {_MAX})",
    **{SPAN.format(table=t, order=d): f"SELECT x FROM (SELECT {f}(?, ?, ?) AS x) q "
                                      "WHERE x IS NOT NULL"
       for t, d, f in (("steps", "", "gw_first_step"), ("steps", " DESC", "gw_last_step"),
                       ("param_norms", "", "gw_first_param"),
                       ("param_norms", " DESC", "gw_last_param"))},
}
"""Whole statements of the storage modules and their form over the packs (same
parameters)."""
_PARTS = {
    "(SELECT max(step) FROM steps t WHERE t.sid=e.sid)": f"gw_last_step(e.sid, -1, {_MAX})",
}
"""Parts of statements (no parameters in them) and their form over the packs."""
_RANGE = re.compile(
    r"FROM (steps|param_norms)( [a-z])? ([^?]*?)WHERE (?:[a-z]\.)?sid=\? AND "
    r"(?:[a-z]\.)?step (BETWEEN \? AND \?|IN \(([?,]+)\)|=\?)")
"""A read of one series' steps in a range or at listed steps: the table is replaced by
the function of those steps, which takes the WHERE clause's parameters in their order."""


def _range(m: re.Match[str]) -> str:
    table, alias, between, cond, listed = m.group(1), m.group(2) or "", m.group(3), \
        m.group(4), m.group(5)
    if cond.startswith("BETWEEN"):
        call = f"gw_{table}_in(?, ?, ?)"
    else:
        n = 1 if listed is None else listed.count("?")
        call = f"gw_{table}_at(?, VARIADIC ARRAY[{','.join('?' * n)}]::BIGINT[])"
    return f"FROM {call}{alias or ' ' + table} {between}WHERE TRUE"


def packed_form(sql: str) -> str:
    """A storage statement (SQLite's words) in its form over the packs: unchanged unless
    it writes or reads steps or per-parameter norms by range."""
    exact = _EXACT.get(sql)
    if exact is not None:
        return exact
    if "steps" not in sql and "param_norms" not in sql:
        return sql
    for part, form in _PARTS.items():
        sql = sql.replace(part, form)
    return _RANGE.sub(_range, sql)

