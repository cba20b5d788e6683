"""Every reader's error tells a malformed record in plain words: the field, what it holds,
what it must be; never a validator's internals."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gradwatch.validation import plain_error
from gradwatch.wire import PROTOCOL_VERSION, parse_record
from gradwatch.wirejson import dump_record
from tests.core.logs import clean_log

STEP = json.loads(dump_record(clean_log(1)[1]))
assert STEP["type"] == "step"

INTERNALS = ("discriminator", "Input should", "Field required", "Extra inputs", "Value error",
             "union_tag", "loc=", "validation error", "pydantic", "For further information",
             "Input tag", "Unable to extract")


def _error(line: str | bytes) -> str:
    with pytest.raises(ValidationError) as e:
        parse_record(line, PROTOCOL_VERSION)
    return plain_error(e.value)


def _step(**change: object) -> str:
    return json.dumps({**STEP, **change})


@pytest.mark.parametrize("line, sentence", [
    ('{"seq": 1, "t": 1.0}',
     "the record has no 'type' field saying which kind of record it is"),
    ('{"type": "stepp", "seq": 1, "t": 1.0}',
     "the record has the unknown type 'stepp' (known: header, optimizer, site, step, stats, "
     "end, unowned, holding, scalars)"),
    ("[1, 2]", "the record is a list, not an object"),
    ('{"type": "step"}', "fields 'seq', 't', 'opt', 'step' of the 'step' record are missing"),
    (_step(opt=None), "field 'opt' of the 'step' record is null: it must be a valid string"),
    (_step(step="zero"),
     "field 'step' of the 'step' record is \"zero\": it must be a valid integer"),
    (_step(closure_evals=-1),
     "field 'closure_evals' of the 'step' record is -1: it must be greater than or equal "
     "to 0"),
    (_step(colour="red"), "the 'step' record has no field 'colour'"),
    (_step(t="NaN"), "field 't' of the 'step' record is \"NaN\": it must be a finite number"),
    ('{"type": "end", "seq": 1, "t": 1, "status": "done"}',
     "field 'status' of the 'end' record is \"done\": it must be 'finished', 'failed' or "
     "'interrupted'"),
    ('{"type": "end", "seq": 1, "t": 1, "steps": "x", "dropped": "y"}',
     "field 'steps' of the 'end' record is \"x\": it must be a valid integer "
     "(and 1 more problem)"),
    ('{"type": "end", "seq": 1,', "not valid JSON (EOF while parsing a value at column 25)"),
])
def test_a_malformed_record_is_told_in_plain_words(line: str, sentence: str) -> None:
    assert _error(line) == sentence


def test_a_nested_field_is_named_by_its_path() -> None:
    bad = _step(resets=[{"how": "optimizer_zero_grad", "params": [0, "one"]}])
    assert _error(bad) == ("field 'resets[0].params[1]' of the 'step' record is \"one\": "
                           "it must be a valid integer")


def test_a_record_in_a_frame_is_named_by_its_index() -> None:
    from gradwatch.server.errors import InvalidFrame
    from gradwatch.server.parsing import parse_frame

    frame = {"type": "batch", "v": PROTOCOL_VERSION, "run": "r", "rank": 0,
             "records": [STEP, {**STEP, "seq": 2, "t": "soon"}]}
    with pytest.raises(InvalidFrame) as e:
        parse_frame(json.dumps(frame))
    assert e.value.reason == ("invalid frame: field 't' of record 1 ('step') is \"soon\": it "
                              "must be a valid number")
    with pytest.raises(InvalidFrame) as e:
        parse_frame('{"run": "r"}')
    assert e.value.reason == ("invalid frame: the frame has no 'type' field saying which "
                              "kind of frame it is")


_values = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8),
                    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3),
                                                                        st.integers(),
                                                                        max_size=2))


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from([*STEP, "type", "extra"]), value=_values,
       drop=st.booleans())
def test_no_malformed_step_shows_the_validators_internals(field: str, value: object,
                                                          drop: bool) -> None:
    rec = dict(STEP)
    if drop:
        rec.pop(field, None)
    else:
        rec[field] = value
    try:
        parse_record(json.dumps(rec), PROTOCOL_VERSION)
    except ValidationError as e:
        text = plain_error(e)
        assert not [w for w in INTERNALS if w in text], text
        assert field in text or "type" in text, text
