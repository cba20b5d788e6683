"""Schema 3: the migration of a database the current release wrote, exports rebuilt from
columns, retention of per-parameter norms, and a database from a newer gradwatch."""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import sqlite3
import stat
from pathlib import Path
from typing import Any

import pytest
import synth
from apps import app_settings
from fastapi.testclient import TestClient

from gradwatch.server import create_app, db
from gradwatch.server.batch import batch_of_records
from gradwatch.server.errors import NewerDatabase
from gradwatch.server.exports import export_lines
from gradwatch.server.reader import Reader
from gradwatch.server.steptable import row_of, step_columns
from gradwatch.server.storage import Store
from gradwatch.wire import PROTOCOL_VERSION, Reset, Scalars, Step, StepSites, parse_record
from tests.core.test_wire_v2 import _random_step

FIXTURE = Path(__file__).parent / "fixtures" / "release-current.db"


def same(a: Any, b: Any) -> bool:
    """Two records equal in meaning (NaN equal to NaN: compared as their JSON)."""
    return bool(a.model_dump_json() == b.model_dump_json())


def release_lines(path: Path) -> dict[tuple[str, int], list[str]]:
    """Every stream's records as the release exported them (its ``records`` table)."""
    c = sqlite3.connect(path)
    out: dict[tuple[str, int], list[str]] = {}
    for run, rank, body in c.execute(
            "SELECT u.id, r.rank, r.body FROM records r JOIN runs u ON u.rid=r.rid "
            "ORDER BY u.id, r.rank, r.seq"):
        out.setdefault((run, rank), []).append(body)
    c.close()
    return out


def copy_fixture(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    shutil.copyfile(FIXTURE, data / db.DB_NAME)
    os.chmod(data / db.DB_NAME, 0o600)
    return data


def test_the_release_database_migrates_with_everything_in_it(tmp_path: Path) -> None:
    data = copy_fixture(tmp_path)
    before = release_lines(data / db.DB_NAME)
    old = sqlite3.connect(data / db.DB_NAME)
    runs_before = old.execute("SELECT id, name, status, steps, findings, ranks, optimizers, "
                              "dropped FROM runs ORDER BY id").fetchall()
    findings_before = old.execute("SELECT rid, rank, opt, kind, body FROM findings "
                                  "ORDER BY 1, 2, 3, 4").fetchall()
    old.close()
    with TestClient(create_app(app_settings(data_dir=data))) as client:
        for (run, rank), lines in before.items():
            got = client.get(f"/api/runs/{run}/export?rank={rank}").text.splitlines()
            assert len(got) == len(lines), (run, rank)
            for want, line in zip(lines, got, strict=True):
                if '"t":NaN' in want:  # an old release's non-finite time: repaired
                    d = json.loads(line)
                    assert math.isfinite(d["t"])
                    want = want.replace('"t":NaN', f'"t":{d["t"]!r}')
                back = parse_record(line, PROTOCOL_VERSION)
                assert same(parse_record(want, 1), back), (run, rank, want)
        steps = client.get("/api/runs/alpha/steps?max_points=100000").json()
        assert len(steps["step"]) == 570
        assert client.get("/api/runs/alpha/findings").status_code == 200
    conn = sqlite3.connect(data / db.DB_NAME)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == db.SCHEMA_VERSION
    assert conn.execute("SELECT id, name, status, steps, findings, ranks, optimizers, dropped "
                        "FROM runs ORDER BY id").fetchall() == runs_before
    assert conn.execute("SELECT rid, rank, opt, kind, body FROM findings "
                        "ORDER BY 1, 2, 3, 4").fetchall() == findings_before
    assert conn.execute("SELECT count(*) FROM records WHERE kind='step'").fetchone()[0] == 0
    conn.close()
    for p in data.iterdir():  # still its owner's alone after the migration and VACUUM
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    assert stat.S_IMODE(data.stat().st_mode) == 0o700


def test_a_migrated_run_goes_on_judging_after_a_restart(tmp_path: Path) -> None:
    data = copy_fixture(tmp_path)
    s = Store(data)
    s.start()
    s.close()
    f = Reader(data).findings("alpha")
    s2 = Store(data)  # state rebuilt from the columns finds the same findings
    s2.start()
    st = s2.call(s2._state, "alpha")
    # the same findings; their words (message, fix, the order of their lines) are those of
    # the gradwatch that judged them, which may be older than this one
    def same(x: Any) -> str:
        d = x.model_dump(exclude={"message", "fix"})
        d["where"] = sorted(map(str, d["where"]))
        return repr(d)

    assert sorted(map(same, st.verdict.findings())) == sorted(map(same, f or []))
    s2.close()


def test_a_database_of_a_newer_gradwatch_is_refused_untouched(tmp_path: Path) -> None:
    data = copy_fixture(tmp_path)
    c = sqlite3.connect(data / db.DB_NAME)
    c.execute("PRAGMA user_version=99")
    c.commit()
    c.close()
    raw = (data / db.DB_NAME).read_bytes()
    with pytest.raises(NewerDatabase, match="newer gradwatch"):
        Store(data)
    assert (data / db.DB_NAME).read_bytes() == raw


def every_field_step(seq: int, i: int) -> Step:
    """A step with every field of the wire set to something other than its default."""
    return Step(seq=seq, t=1000.5 + i, opt="Adam#0", step=i, skipped=True, closure_evals=2,
                backwards=3, consumed=9, fresh=4, stale=3, leaked=2, stale_params=[0, 2],
                leaked_params=[1], late_params=[2], discarded=1, discarded_params=[0],
                resets=[Reset(how="zero_", params=[0, 1], discarded=1, after_backward=True,
                              site=7),
                        Reset(how="set_none", params=[2])],
                norm=math.nan, fresh_norm=math.inf, drift=-math.inf,
                param_norms=[0.1, None, math.nan, math.inf],  # float64 values, a gap
                param_fresh_norms=[1.5, 2.5, 0.0, 3.0],  # float32-exact
                sites=StepSites(step=1, stale=[2], leaked=[3], lost=[4], fresh=[5]),
                loss=math.nan, lr=[0.001, 1e-4])


def test_exports_rebuild_every_step_field_from_the_columns(where: Path | str) -> None:
    full = every_field_step(2, 0)
    unset = {f for f in Step.model_fields if f != "type"} - full.model_fields_set
    assert not unset, unset  # a field added to Step must be added here
    plain = Step(seq=3, t=1002.0, opt="Adam#0", step=1, norm=1.0, fresh_norm=1.0, drift=1.0,
                 param_norms=[0.5, 0.25, 0.125, 1.0], param_fresh_norms=[0.5, 0.25, 0.125,
                                                                          1.0],
                 resets=[Reset(how="optimizer_zero_grad", params=[0, 1, 2, 3], site=7)])
    bare = Step(seq=4, t=1003.0, opt="Adam#0", step=2, loss=0.75)
    scal = Scalars(seq=5, t=1003.5, step=2, opt=None, values={"acc": 0.5, "nan": math.nan})
    recs: list[Any] = synth.records(steps=0, end=False, opt="Adam#0")[:2]
    recs += [full, plain, bare, scal]
    s = Store(where)
    s.start()
    s.call(s.ingest, batch_of_records("run1", 0, recs))
    s.close()
    got = export_lines(Reader(where), "run1")
    assert got is not None
    back = [parse_record(x, PROTOCOL_VERSION) for x in got]
    assert len(back) == len(recs)
    for want, have in zip(recs, back, strict=True):
        assert same(want, have), (want, have)


def test_keep_param_norms_every_n_keeps_what_plots_need(where: Path | str) -> None:
    recs = synth.records(steps=100, end=True, stale_from=None)
    recs[2 + 37] = synth.step(recs[2 + 37].seq, 37, stale_from=37)  # a finding fact
    recs[2 + 55] = synth.step(recs[2 + 55].seq, 55, nan_at=55)
    s = Store(where, keep_param_norms=10)
    s.start()
    s.call(s.ingest, batch_of_records("run1", 0, recs))
    s.close()
    p = Reader(where).params("run1", "SGD#0", max_points=1000)
    assert p is not None
    assert p.step == sorted(list(range(0, 100, 10)) + [37, 55])
    assert p.norm[p.step.index(20)] == pytest.approx(recs[2 + 20].param_norms, rel=1e-6)
    assert math.isnan(p.norm[p.step.index(55)][0])
    steps = Reader(where).steps("run1", max_points=1000)
    assert steps is not None and len(steps.rows) == 100  # the steps themselves all stay


def test_a_row_made_from_the_columns_is_the_row_of_the_record() -> None:
    rng = random.Random(3)
    steps = [every_field_step(2, 0), *(_random_step(rng) for _ in range(400))]
    for s in steps:
        want, got = synth.row_from_step(s, 3), row_of(3, s.opt, step_columns(s))
        assert repr(got) == repr(want), (s, got, want)  # repr: NaN equals NaN
