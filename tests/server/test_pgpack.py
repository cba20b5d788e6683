"""PostgreSQL's packed steps (schema 6, ``server/pgpack.py``): a schema-5 database, its
steps a row each, migrates to packs and reads back what it read before; the packed and
the open rows of one database read as one.

The storage tests over both backends (``where``) hold every read equal to SQLite's; these
hold what only PostgreSQL has: the migration and where the rows went."""

from __future__ import annotations

import math
from array import array
from typing import Any

import psycopg
import synth

from gradwatch.server.batch import batch_of_records
from gradwatch.server.db import CHUNK
from gradwatch.server.migrate import statements
from gradwatch.server.pgarrays import literal
from gradwatch.server.pgdb import PostgresDatabase
from gradwatch.server.pgschema import MIGRATIONS, SCHEMA, SCHEMA_VERSION
from gradwatch.server.steptable import PARAMS_INSERT, STEPS_INSERT
from gradwatch.server.storage import Store
from gradwatch.wire import Scalars

TABLES = ("runs", "streams", "records", "series", "steps", "param_norms", "reset_sets",
          "scalars", "step_agg", "optimizers", "findings", "run_writers")
"""The tables of schema 5, in an order their rows can be copied in."""
SEQUENCES = (("runs", "rid"), ("series", "sid"), ("reset_sets", "id"))


def streams() -> dict[tuple[str, int], list[Any]]:
    """Records of two runs: a finished one past several chunks (a finding, a NaN norm,
    scalars), and one of two ranks still running (each with an open chunk)."""
    one = synth.records("run1", steps=5 * CHUNK + 9, stale_from=4 * CHUNK + 3, nan_at=70)
    one.insert(40, Scalars(seq=0, t=1000.5, step=37, opt=None,
                           values={"acc": 0.5, "nan": math.nan}))
    one = [r.model_copy(update={"seq": i}) for i, r in enumerate(one)]
    out = {("run1", 0): one}
    for rank in (0, 1):
        out[("run2", rank)] = synth.records("run2", steps=2 * CHUNK + 20 + rank, rank=rank,
                                            end=False, world_size=2)
    return out


def store_all(s: Store, recs: dict[tuple[str, int], list[Any]], upto: int | None = None,
              since: int = 0) -> None:
    for (run, rank), rs in recs.items():
        part = rs[since:upto]
        for i in range(0, len(part), 50):
            s.call(s.ingest, batch_of_records(run, rank, part[i:i + 50]))


def reads(s: Store) -> dict[str, Any]:
    """Everything a user reads of the database, by each read of the storage interface."""
    r = s.reader
    out: dict[str, Any] = {"runs": [x.model_dump() for x in r.runs()]}
    for run in ("run1", "run2"):
        out[run] = {
            "run": r.run(run), "findings": r.findings(run),
            "optimizers": r.optimizers(run),
            "scalars": r.scalars(run),
            "steps": [r.steps(run, max_points=m) for m in (10**6, 40, 7)],
            "range": [r.steps(run, start=a, end=b, max_points=m)
                      for a, b, m in ((60, 200, 10**6), (3, 300, 20), (129, 129, 5))],
            "params": [r.params(run, "SGD#0", rank, max_points=m, start=a)
                       for rank in (0, 1) for m in (10**6, 9) for a in (None, 65)],
            "csv": list(r.export_csv(run) or []),
            "lines": [list(r.export_lines(run, rank) or []) for rank in (0, 1)],
            "resume": [s.resume_seq(run, rank) for rank in (0, 1)],
        }
    return out


def _nan_safe(x: dict[str, Any]) -> dict[str, str]:
    """NaN != NaN: the reads' text, read by read."""
    return {f"{k}.{j}": repr(w) for k, v in x.items()
            for j, w in (v.items() if isinstance(v, dict) else [("", v)])}


def schema_5_copy(src: str, dst: str) -> None:
    """Write into the empty database ``dst`` the tables of schema 5 (as its release made
    them, a row per step) holding every row of ``src``."""
    with psycopg.connect(dst, autocommit=True) as d, psycopg.connect(src) as s:
        for stmt in statements(SCHEMA):
            d.execute(stmt)
        MIGRATIONS[5](d)
        d.execute("CREATE TABLE gradwatch_schema(version INTEGER NOT NULL)")
        d.execute("INSERT INTO gradwatch_schema VALUES(5)")
        for table in TABLES:
            rows = s.execute(f"SELECT * FROM {table}").fetchall()
            if rows:
                marks = ",".join(["%s"] * len(rows[0]))
                with d.cursor() as cur:
                    cur.executemany(f"INSERT INTO {table} VALUES({marks})", rows)
        for table, col in SEQUENCES:
            d.execute(f"SELECT setval(pg_get_serial_sequence('{table}', '{col}'), "
                      f"(SELECT max({col}) FROM {table}))")


def kinds(url: str) -> dict[str, str]:
    with psycopg.connect(url) as c:
        return dict(c.execute("SELECT relname, relkind::text FROM pg_class WHERE relname = "
                              "ANY(%s)", (["steps", "param_norms", "step_packs"],)))


def test_a_schema_5_database_migrates_to_packed_steps_and_reads_back_equal(
        pg_cluster: Any) -> None:
    recs = streams()
    first = pg_cluster.new_database()
    a = Store(first)
    a.start()
    store_all(a, recs, upto=-12)  # run2's ranks go on after the migration
    a.close()
    a = Store(first)  # started again, as the migrated one will be (live runs interrupted)
    a.start()
    try:
        before = _nan_safe(reads(a))
        old = pg_cluster.new_database()
        schema_5_copy(first, old)
        assert kinds(old) == {"steps": "r", "param_norms": "r"}
        b = Store(old)  # migrates 5 -> 7
        b.start()
        try:
            assert kinds(old) == {"steps": "v", "param_norms": "v", "step_packs": "r"}
            with psycopg.connect(old) as c:
                assert c.execute("SELECT version FROM gradwatch_schema").fetchone() == (
                    SCHEMA_VERSION,)
                # schema 7: the packing function is PL/pgSQL (a session plans it once)
                assert c.execute("SELECT l.lanname FROM pg_proc p JOIN pg_language l ON "
                                 "l.oid = p.prolang WHERE p.proname = 'gw_put_pack'"
                                 ).fetchall() == [("plpgsql",)]
                # Every summarised chunk packed; only the open chunks' rows left a row each.
                packed, open_rows = c.execute(
                    "SELECT (SELECT count(*) FROM step_packs), "
                    "(SELECT count(*) FROM step_rows)").fetchone()
                summarised = c.execute("SELECT count(*) FROM step_agg").fetchone()[0]
                assert packed == summarised > 0
                assert 0 < open_rows < 3 * CHUNK
            assert _nan_safe(reads(b)) == before
            # Both go on alike: the migrated database stores and packs as a new one.
            store_all(a, recs, since=-12)
            store_all(b, recs, since=-12)
            after = _nan_safe(reads(a))
            assert after != before
            assert _nan_safe(reads(b)) == after
        finally:
            b.close()
    finally:
        a.close()


def test_steps_resent_into_a_packed_chunk_are_stored_once_and_read_in_order(
        pg_cluster: Any) -> None:
    """A gap filled after its chunk was packed: the pack is rebuilt with it, in order."""
    url = pg_cluster.new_database()
    recs = synth.records("run1", steps=3 * CHUNK, end=False)
    gap = [r for r in recs if getattr(r, "step", None) in (10, 11, 70)]
    rest = [r for r in recs if r not in gap]
    s = Store(url)
    s.start()
    try:
        s.call(s.ingest, batch_of_records("run1", 0, rest))
        with psycopg.connect(url) as c:
            assert c.execute("SELECT count(*) FROM step_packs").fetchone() == (2,)
            # Chunks with a gap list their steps; a full chunk's are its place (below).
            assert c.execute("SELECT chunk, cardinality(step) FROM step_packs ORDER BY "
                             "chunk").fetchall() == [(0, CHUNK - 2), (1, CHUNK - 1)]
        s.call(s.ingest, batch_of_records("run1", 0, gap))
        s.call(s.ingest, batch_of_records("run1", 0, gap))  # resent: nothing new
        got = s.reader.steps("run1", max_points=10**6)
        assert got is not None
        assert [r.step for r in got.rows] == list(range(3 * CHUNK))
        assert s.resume_seq("run1", 0) == recs[-1].seq
        with psycopg.connect(url) as c:
            assert c.execute("SELECT count(*), sum(cardinality(flags)), count(step) FROM "
                             "step_packs").fetchone() == (2, 2 * CHUNK, 0)
            assert c.execute("SELECT count(*) FROM step_rows WHERE step < %s",
                             (2 * CHUNK,)).fetchone() == (0,)
    finally:
        s.close()


def test_norms_of_a_step_stored_in_an_earlier_transaction_join_its_row(
        pg_cluster: Any) -> None:
    """The writer's step rows and their norms are held until stored (server/pgheld.py);
    norms whose step is not held, stored before, go into that step's row: no step is
    added or lost."""
    url = pg_cluster.new_database()
    conn = PostgresDatabase(url).open_writer()

    def step(n: int) -> tuple[Any, ...]:  # sid 1, a plain step n (steptable's columns)
        return (1, n, n, float(n), 1.5, None, None, 0, *[0] * 8, None, None, None, None)

    one, two = array("f", [1.0, 2.0]).tobytes(), array("f", [3.0]).tobytes()
    try:
        for transaction in (  # a step with its norms, as writes.py stores them; then
                ((STEPS_INSERT, [step(5), step(6)]), (PARAMS_INSERT, [(1, 6, one, None)])),
                ((PARAMS_INSERT, [(1, 5, two, None)]),)):  # norms of a step stored before
            conn.execute("BEGIN")
            for stmt, rows in transaction:
                conn.executemany(stmt, rows)
            conn.execute("COMMIT")
    finally:
        conn.close()
    with psycopg.connect(url) as c:
        assert c.execute("SELECT step, seq, norm FROM steps ORDER BY step").fetchall() == [
            (5, 5, 1.5), (6, 6, 1.5)]
        assert c.execute("SELECT step, norms FROM param_norms ORDER BY step").fetchall() == [
            (5, two), (6, one)]


def test_held_columns_reach_postgresql_as_they_were(pg_cluster: Any) -> None:
    """The writer's held columns go to PostgreSQL as array literals built in Python
    (server/pgarrays.py): every value reads back equal, edge values too (the shortest
    float texts, infinities and NaN, -0.0, 64-bit integers, text needing escapes, bytes
    of every value, NULLs), and an array of NULLs is an array of NULLs."""
    floats = [0.1, 1 / 3, 1e-310, 5e-324, 1.7976931348623157e308, -0.0, math.inf, -math.inf,
              math.nan, 123456789.123456789, None, 2, 3.0]
    ints = [0, -1, 2**63 - 1, -(2**63), True, None, 7]
    texts = ['a "quoted" \\ back\\slash', "NULL", "", "{a,b}", " spaced ", "é∑", None,
             '[0.1,"NaN"]']
    blobs = [bytes(range(256)), b"", b"\\x00", None, '[1.5,"NaN"] ']
    with psycopg.connect(pg_cluster.url()) as c:
        got = c.execute("SELECT %s::DOUBLE PRECISION[], %s::BIGINT[], %s::TEXT[], "
                        "%s::BYTEA[], %s::BIGINT[], %s::BOOLEAN[]",
                        (literal(floats, "DOUBLE PRECISION"), literal(ints, "BIGINT"),
                         literal(texts, "TEXT"), literal(blobs, "BYTEA"),
                         literal([None, None], "BIGINT"),
                         literal([True, False, None], "BOOLEAN"))).fetchone()
    f, i, t, b, nulls, bools = got
    assert [repr(x) for x in f] == [repr(None if x is None else float(x)) for x in floats]
    assert i == [None if x is None else int(x) for x in ints]
    assert t == texts
    assert b == [x.encode() if isinstance(x, str) else x for x in blobs]
    assert nulls == [None, None] and bools == [True, False, None]
    assert literal(None, "BIGINT") is None
