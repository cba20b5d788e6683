"""Protocol versions 2 and 3: every record and field round-trips, older logs still read, and the
probe's fast step writer writes what the generic encoder writes."""

from __future__ import annotations

import contextlib
import io
import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from gradwatch import check, encoding
from gradwatch.steplog import read_log
from gradwatch.wire import (
    PROTOCOL_VERSION,
    End,
    Header,
    Holding,
    IngestBatch,
    OptimizerInfo,
    Reset,
    Scalars,
    Site,
    Stats,
    Step,
    StepSites,
    Unowned,
    batch_json,
    json_schema,
    parse_record,
    trusted,
)
from gradwatch.wirejson import ObjectJson, dump_record, floats_text, num, step_text

FIXTURES = Path(__file__).parent / "fixtures"
NAN, INF = math.nan, math.inf


def _meaning(r: BaseModel) -> str:
    """A record's content, NaN equal to NaN (pydantic writes every field, NaN as "NaN")."""
    return r.model_dump_json()


def _every_record() -> list[BaseModel]:
    f32 = 0.25
    return [
        Header(seq=0, t=1.5, run="r", run_name="n", rank=1, world_size=2, torch_version="2",
               gradwatch_version="0.1", started=1.0, host="h", pid=3, argv=["a"],
               norms_every=2, worker=4),
        OptimizerInfo(seq=1, t=2.0, opt="G", cls="Adam", params=["a", "b"], shapes=[[2], []],
                      groups=[0, 1], label="gen_opt", manual=True),
        Site(seq=2, t=2.0, id=7, file="/t.py", line=3, function="main"),
        Step(seq=3, t=2.5, opt="G", step=2**53 - 1, skipped=True, closure_evals=2, backwards=3,
             consumed=9, fresh=4, stale=3, leaked=2, stale_params=[0, 1, 2, 7],
             leaked_params=[1], late_params=[3, 4], discarded=5, discarded_params=[0, 5, 6],
             resets=[Reset(how="zero_", params=[0, 1], discarded=2, after_backward=True,
                           site=7), Reset(how="set_none")],
             norm=INF, fresh_norm=NAN, drift=2.0, param_norms=[f32, None, NAN, -INF],
             param_fresh_norms=[0.1, None, 0.0, INF], loss=-INF, lr=[1e-3, 0.5],
             sites=StepSites(step=7, stale=[7], leaked=[8], lost=[9], fresh=[10])),
        Step(seq=4, t=2.6, opt="G", step=1, norm=None, fresh_norm=1.0, drift=None,
             param_norms=None, param_fresh_norms=[1.0], loss=NAN, lr=[NAN]),
        Step(seq=5, t=2.7, opt="G", step=2, norm=3.0, fresh_norm=None, drift=None,
             param_norms=[3.0], param_fresh_norms=None, loss=0.5),
        Unowned(seq=6, t=3.0, params=["u"], shapes=[[2]], count=1, numel=2, backwards=4,
                first_step=1, step=3),
        Holding(seq=7, t=3.1, opt="G", step=3, requiring=3, held=False, never=[0, 2]),
        Scalars(seq=8, t=3.2, step=4, opt="G", values={"acc": 0.5, "loss": NAN, "x": -INF}),
        Scalars(seq=9, t=3.3, step=5, values={}),
        Stats(seq=10, t=3.4, dropped=5, spooled=1, disabled="why"),
        End(seq=11, t=4.0, status="interrupted", exit_code=-(2**63), steps=3, dropped=5),
    ]


def test_every_record_and_field_round_trips_at_todays_version() -> None:
    records = _every_record()
    steps = [r for r in records if isinstance(r, Step)]
    for name, field in Step.model_fields.items():  # a field added later joins these samples
        if name != "type":
            assert any(getattr(s, name) != field.get_default(call_default_factory=True)
                       for s in steps), f"no sample sets Step.{name}"
    for r in records:
        back = parse_record(dump_record(r), PROTOCOL_VERSION)
        assert type(back) is type(r) and _meaning(back) == _meaning(r)


def test_a_clean_step_leaves_out_what_it_implies_and_packs_its_norms() -> None:
    s = Step(seq=9, t=1.0, opt="SGD#0", step=4, backwards=1, consumed=20, fresh=20,
             resets=[Reset(how="optimizer_zero_grad", params=list(range(20)), site=1)],
             norm=2.0, fresh_norm=2.0, drift=1.0, param_norms=[0.5] * 20,
             param_fresh_norms=[0.5] * 20)
    raw = json.loads(dump_record(s))
    assert not {"fresh_norm", "drift", "param_fresh_norms", "skipped", "stale",
                "stale_params", "sites", "loss", "lr", "backwards", "fresh"} & raw.keys()
    assert raw["param_norms"].startswith("f32:") and raw["resets"][0]["params"] == "0-19"
    assert parse_record(json.dumps(raw), PROTOCOL_VERSION) == s


def test_version_3_leaves_out_a_clean_steps_counts_and_version_2_still_reads_zeros() -> None:
    line = json.dumps({"seq": 1, "t": 1.0, "type": "step", "opt": "a", "step": 0,
                       "consumed": 4})
    at_v3, at_v2 = parse_record(line, 3), parse_record(line, 2)
    assert (at_v3.backwards, at_v3.consumed, at_v3.fresh) == (1, 4, 4)
    assert (at_v2.backwards, at_v2.consumed, at_v2.fresh) == (0, 4, 0)
    # a step whose counts differ from those says so, and reads back the same
    odd = Step(seq=2, t=1.0, opt="a", step=1, backwards=0, consumed=4, fresh=0, stale=4)
    raw = json.loads(dump_record(odd))
    assert raw["backwards"] == 0 and raw["fresh"] == 0
    assert parse_record(dump_record(odd), 3) == odd
    idle = Step(seq=3, t=1.0, opt="a", step=2, backwards=0)
    assert json.loads(dump_record(idle))["backwards"] == 0
    assert parse_record(dump_record(idle), 3) == idle


def test_an_explicit_null_means_unknown_and_a_left_out_norm_what_it_implies() -> None:
    base = {"seq": 1, "t": 1.0, "type": "step", "opt": "a", "step": 0, "norm": 3.0,
            "param_norms": [1.0, 2.0]}
    implied = parse_record(json.dumps(base), 2)
    assert implied.fresh_norm == 3.0 and implied.drift == 1.0
    assert implied.param_fresh_norms == [1.0, 2.0]
    unknown = parse_record(json.dumps({**base, "fresh_norm": None, "drift": None,
                                       "param_fresh_norms": None}), 2)
    assert unknown.fresh_norm is None and unknown.drift is None
    assert unknown.param_fresh_norms is None
    at_v1 = parse_record(json.dumps(base), 1)  # version 1 implies nothing
    assert at_v1.fresh_norm is None and at_v1.drift is None and at_v1.param_fresh_norms is None


def test_a_line_is_read_at_the_version_it_is_given_never_guessed() -> None:
    line = dump_record(Step(seq=1, t=1.0, opt="a", step=0, stale_params=[0, 1],
                            norm=1.0, fresh_norm=1.0, drift=1.0))
    with pytest.raises(ValidationError, match="stale_params"):
        parse_record(line, 1)  # "0-1" is no list at version 1


def test_an_ingest_batch_reads_its_records_at_its_own_version() -> None:
    records = _every_record()[1:]
    lines = [dump_record(r).encode() for r in records]
    frame = IngestBatch.model_validate_json(batch_json("r", 0, PROTOCOL_VERSION, lines))
    assert [_meaning(r) for r in frame.records] == [_meaning(r) for r in records]
    with pytest.raises(ValidationError, match=r"records\.2"):  # the first packed step
        IngestBatch.model_validate_json(batch_json("r", 0, 1, lines))
    assert (json.loads(IngestBatch(run="r", records=[]).model_dump_json())["v"]
            == PROTOCOL_VERSION)


def test_a_header_read_from_a_v1_log_is_written_again_at_todays_version() -> None:
    log = read_log(FIXTURES / "hand_v1.jsonl")
    assert log.header.v == 1
    assert json.loads(dump_record(log.header))["v"] == PROTOCOL_VERSION


@pytest.mark.parametrize("name", ["probe_v1", "hand_v1", "probe_v2", "hand_v2"])
def test_older_logs_still_read_and_judge_as_they_did(name: str) -> None:
    path = FIXTURES / f"{name}.jsonl"
    v = int(name[-1])
    log = read_log(path)
    assert log.header.v == v and not log.warnings
    lines = path.read_text().splitlines()[1:]
    for line, rec in zip(lines, log.records, strict=True):
        assert _meaning(rec) == _meaning(parse_record(line, v))
        # and written again (at today's version) it reads back the same
        assert _meaning(parse_record(dump_record(rec), PROTOCOL_VERSION)) == _meaning(rec)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = check.main(["--json", str(path)])
    assert code == 1
    got = json.loads(out.getvalue())
    then = json.loads((FIXTURES / f"{name}.check.json").read_text())
    # the --json contract adds keys, never renames or changes one: what was printed then
    # is printed now; "stopped" (version 4) places an older log's stop at its latest step
    stopped = got["summary"].pop("stopped")
    assert got["summary"].pop("model_norms") is None  # no parameter on a device mesh
    assert got == then
    if name.startswith("hand"):  # its records set every field: a Stats says it stopped
        last = {"hand_v1": 2, "hand_v2": 5}[name]  # the step of its last step record
        assert [(s["rank"], s["worker"], s["after_step"], s["cause"]) for s in stopped] == [
            (1, 3, last, "an internal error")]
    else:
        assert stopped == []


def _random_step(rng: random.Random) -> Step:
    def norm() -> float | None:
        return rng.choice([None, 0.0, 1.5, NAN, INF, -INF, rng.random(), 2.0])

    def norms(n: int) -> list[float | None] | None:
        return None if rng.random() < 0.2 else [norm() for _ in range(n)]

    def indices() -> list[int]:
        return sorted(rng.sample(range(30), rng.randint(0, 6)))

    n = rng.randint(1, 8)
    per = norms(n)
    fields: dict[str, Any] = {
        "seq": rng.randint(0, 10**9), "t": rng.random() * 1e9, "type": "step",
        "opt": rng.choice(["SGD#0", 'a "quoted" é']), "step": rng.randint(0, 2**53 - 1),
        "skipped": rng.random() < 0.2, "closure_evals": rng.choice([0, 3]),
        "backwards": rng.randint(0, 3), "consumed": rng.randint(0, 9),
        "fresh": rng.randint(0, 9), "stale": rng.choice([0, 2]), "leaked": rng.choice([0, 1]),
        "stale_params": indices(), "leaked_params": indices(), "late_params": indices(),
        "discarded": rng.choice([0, 4]), "discarded_params": indices(),
        "resets": [trusted(Reset, {"how": rng.choice(["zero_", "set_none"]),
                                   "params": indices(), "discarded": rng.choice([0, 1]),
                                   "after_backward": rng.random() < 0.5,
                                   "site": rng.choice([None, 3])})
                   for _ in range(rng.randint(0, 2))],
        "norm": norm(), "fresh_norm": norm(), "drift": norm(),
        "param_norms": per, "param_fresh_norms": per if rng.random() < 0.5 else norms(n),
        "sites": None if rng.random() < 0.5 else trusted(StepSites, {
            "step": rng.choice([None, 2]), "stale": [1], "leaked": [], "lost": [4, 5],
            "fresh": [], "reset": rng.choice([None, 6])}),
        "loss": norm(), "lr": None if rng.random() < 0.5 else [0.1, 1e-4][:rng.randint(1, 2)],
    }
    if rng.random() < 0.5 and isinstance(fields["norm"], float):  # drift as the probe makes it
        fields["fresh_norm"] = fields["norm"] if rng.random() < 0.5 else fields["fresh_norm"]
        fields["drift"] = (fields["norm"] / fields["fresh_norm"] if fields["fresh_norm"]
                           else None)
    return trusted(Step, fields)


def test_the_fast_step_writer_writes_what_the_generic_encoder_writes() -> None:
    rng = random.Random(22)
    for _ in range(2000):
        s = _random_step(rng)
        text = step_text(s)
        assert text == ObjectJson.encode(s)
        assert _meaning(parse_record(text, PROTOCOL_VERSION)) == _meaning(s)


def test_the_schema_documents_the_new_record_and_step_fields() -> None:
    schema = json.dumps(json_schema())
    assert '"scalars"' in schema and '"loss"' in schema and '"lr"' in schema
    assert json_schema()["protocol_version"] == PROTOCOL_VERSION


def test_a_short_float_list_is_written_plain_where_that_is_shorter_and_reads_back() -> None:
    s = Step(seq=1, t=1.0, opt="SGD#0", step=0, lr=[0.1], loss=0.5,
             param_norms=[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    for text in (step_text(s), ObjectJson.encode(s)):
        assert '"lr":[0.1]' in text and '"param_norms":"f32:' in text
        assert parse_record(text, PROTOCOL_VERSION) == s


def test_a_short_float_list_takes_the_shorter_form_plain_on_a_tie() -> None:
    # the reference: both forms made, the shorter kept (plain when equal); the writer skips
    # packing when the plain form cannot lose, so this checks that shortcut never differs
    rng = random.Random(7)
    pool = [0.1, 1.0, -0.0, 3e-5, 1e300, 5e-324, 0.30000000000000004, 2.5, None,
            float("nan"), float("inf"), 123456.789, 1 / 3]
    for n in range(1, 5):
        for _ in range(400):
            xs = [rng.choice(pool) if rng.random() < 0.6 else rng.uniform(-1e3, 1e3)
                  for _ in range(n)]
            packed = '"' + encoding.pack(xs) + '"'
            plain = "[" + ",".join("null" if x is None else num(x) for x in xs) + "]"
            assert floats_text(xs) == (plain if len(plain) <= len(packed) else packed), xs
