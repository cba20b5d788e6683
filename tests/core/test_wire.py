"""The wire contract: round trips, non-finite floats, versions and clear rejections."""

from __future__ import annotations

import json
import math

import pytest
from pydantic import ValidationError

from gradwatch.wire import (
    FINDING_KINDS,
    INT64_MAX,
    PROTOCOL_VERSION,
    STEP_MAX,
    End,
    Finding,
    IngestBatch,
    Reset,
    Site,
    Step,
    StepSites,
    json_schema,
    parse_record,
    trusted,
)
from gradwatch.wirejson import dump_record
from tests.core.logs import header, step


def test_step_round_trips_with_nan_and_inf_as_data() -> None:
    s = step(3, 1, norm=float("nan"), drift=float("inf"), param_norms=[1.5, float("-inf")])
    line = dump_record(s)
    # Browsers' JSON.parse rejects bare NaN: non-finite values travel as strings.
    raw = json.loads(line)
    assert raw["norm"] == "NaN" and raw["drift"] == "Infinity"
    back = parse_record(line, PROTOCOL_VERSION)
    assert isinstance(back, Step)
    assert math.isnan(back.norm) and back.drift == math.inf
    assert back.param_norms == [1.5, -math.inf]


def test_trusted_record_is_the_validated_record() -> None:
    validated = step(4, 2, norm=float("inf"), param_norms=[0.5, None], stale=1, stale_params=[1],
                     resets=[Reset(how="zero_", params=[0], discarded=1)])
    fields = dict(validated.__dict__)
    fields["resets"] = [trusted(Reset, dict(r.__dict__)) for r in validated.resets]
    made = trusted(Step, fields)
    assert made == validated
    assert dump_record(made) == dump_record(validated)
    assert parse_record(dump_record(made), PROTOCOL_VERSION) == validated


def test_unknown_protocol_version_is_refused_with_a_sentence() -> None:
    raw = json.loads(dump_record(header()))
    raw["v"] = 99
    with pytest.raises(ValidationError, match="protocol version 99 is not supported"):
        parse_record(json.dumps(raw), PROTOCOL_VERSION)


@pytest.mark.parametrize("bad", [
    '{"type": "step", "seq": -1, "t": 0, "opt": "a", "step": 0}',
    '{"type": "step", "seq": 1, "t": 0, "opt": "a", "step": "three"}',
    '{"type": "nope", "seq": 1, "t": 0}',
    '{"type": "step", "seq": 1, "t": 0, "opt": "a", "step": 0, "surprise": 1}',
    "[1, 2]",
    "not json",
])
def test_malformed_records_are_rejected(bad: str) -> None:
    with pytest.raises(ValidationError):
        parse_record(bad, PROTOCOL_VERSION)


def test_run_ids_cannot_carry_paths() -> None:
    with pytest.raises(ValidationError):
        IngestBatch(run="../../etc/passwd", records=[])


def test_schema_names_every_finding_kind() -> None:
    schema = json.dumps(json_schema())
    for kind in FINDING_KINDS:
        assert kind in schema


def test_sites_round_trip_and_logs_from_before_them_still_read() -> None:
    site = Site(seq=3, t=1.0, id=1, file="/work/train.py", line=12, function="train")
    assert parse_record(dump_record(site), PROTOCOL_VERSION) == site
    s = step(4, 2, stale=1, stale_params=[0], sites=StepSites(step=1, stale=[2]),
             resets=[Reset(how="optimizer_zero_grad", site=1)])
    assert parse_record(dump_record(s), PROTOCOL_VERSION) == s
    old = json.loads(step(5, 3, resets=[Reset(how="zero_")]).model_dump_json())
    del old["sites"], old["resets"][0]["site"]  # a line written before sites existed
    back = parse_record(json.dumps(old), 1)
    assert back.sites is None and back.resets[0].site is None
    with pytest.raises(ValidationError):
        parse_record(json.dumps({**json.loads(dump_record(site)), "id": 0}), 2)
    f = Finding(kind="late_reset", optimizer="SGD#0", first_step=0, last_step=0, steps=1,
                params=[], message="", fix="")
    assert f.where == [] and "where" in json.dumps(json_schema()["finding"])


HOSTILE = [  # (record type, field, value as JSON text, what the error says)
    ("step", "t", '"NaN"', "finite number"),
    ("step", "t", "NaN", "finite number"),
    ("step", "t", "1e400", "finite number"),
    ("header", "started", '"-Infinity"', "finite number"),
    ("step", "seq", str(2**64), "less than or equal to 9223372036854775807"),
    ("step", "backwards", str(2**70), "less than or equal to 9223372036854775807"),
    ("step", "step", str(2**53), "less than or equal to 9007199254740991"),
    ("end", "exit_code", str(-(2**70)), "greater than or equal to"),
    ("header", "world_size", str(2**64), "less than or equal to"),
]


@pytest.mark.parametrize(("kind", "field", "value", "says"), HOSTILE)
def test_values_past_64_bits_and_non_finite_times_are_refused_by_name(
        kind: str, field: str, value: str, says: str) -> None:
    rec = {"header": header(), "step": step(2, 0), "end": End(seq=3, t=2.0)}[kind]
    line = dump_record(rec)
    raw = json.loads(line)
    raw[field] = "@@"
    bad = json.dumps(raw).replace('"@@"', value)
    with pytest.raises(ValidationError) as e:
        parse_record(bad, PROTOCOL_VERSION)
    err = e.value.errors()[0]
    assert err["loc"][-1] == field and says in err["msg"]


def test_the_largest_allowed_values_still_read_and_norms_may_be_non_finite() -> None:
    s = step(INT64_MAX, STEP_MAX, backwards=INT64_MAX, norm=float("-inf"))
    back = parse_record(dump_record(s), PROTOCOL_VERSION)
    assert back.seq == INT64_MAX and back.step == STEP_MAX and back.norm == -math.inf
    schema = json.dumps(json_schema())
    assert str(STEP_MAX) in schema and str(INT64_MAX) in schema
