"""The forms of protocol version 2: index ranges and packed float arrays, both ways."""

from __future__ import annotations

import math
import struct
import time

import pytest

from gradwatch.encoding import MAX_ITEMS, FormError, expand, pack, ranges, same, same_list, unpack


@pytest.mark.parametrize(("indices", "text"), [
    ([], ""),
    ([0], "0"),
    (list(range(20)), "0-19"),
    ([1, 4, 5, 6], "1,4-6"),
    ([3, 1, 2], "3,1-2"),  # any order round-trips
])
def test_index_lists_are_written_as_ranges_and_read_back(indices: list[int], text: str) -> None:
    assert ranges(indices) == text
    assert expand(text) == indices


@pytest.mark.parametrize(("text", "says"), [
    (f"0-{MAX_ITEMS}", "more than"),
    (f"0-{2**62}", "more than"),
    ("5-1", "backwards"),
    ("1,,2", "not an index"),
    ("-3", "not an index"),
    ("1-2-3", "not an index"),
    ("9" * 30, "not an index"),
    ("١", "not an index"),  # a digit, but not an ASCII one
])
def test_ranges_past_the_bound_or_malformed_are_refused_before_expanding(
        text: str, says: str) -> None:
    started = time.perf_counter()
    with pytest.raises(FormError, match=says):
        expand(text)
    assert time.perf_counter() - started < 1.0  # refused, not expanded and then counted


def _same(a: list[float | None], b: list[float | None]) -> bool:
    return len(a) == len(b) and all(
        x is y or (x is not None and y is not None and (x == y or x != x and y != y))
        for x, y in zip(a, b, strict=True))


def test_float32_values_pack_as_f32_with_nan_and_infinities_as_ordinary_values() -> None:
    values: list[float | None] = [struct.unpack("<f", struct.pack("<f", 0.1))[0], 0.0,
                                  math.nan, math.inf, -math.inf, 3.5]
    text = pack(values)
    assert text.startswith("f32:") and "!" not in text
    assert _same(unpack(text), values)


def test_a_value_float32_would_round_is_packed_as_f64_exactly() -> None:
    values: list[float | None] = [0.1, 1.0, 1e300]
    text = pack(values)
    assert text.startswith("f64:")
    assert unpack(text) == values


def test_missing_entries_follow_the_bang_as_ranges_and_read_back_as_none() -> None:
    values: list[float | None] = [None, None, 2.0, None, 0.5]
    text = pack(values)
    assert text.endswith("!0-1,3")
    assert unpack(text) == values


@pytest.mark.parametrize(("text", "says"), [
    ("f16:AAAA", "starts with"),
    ("f32:not base64!", "not base64"),
    ("f32:AAA=", "whole number"),
    ("f32:AAAAAA==!1", "past the array"),
    ("f32:" + "A" * (MAX_ITEMS * 8), "at most"),
])
def test_broken_packed_arrays_are_refused_with_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(FormError, match=says):
        unpack(text)


def test_equal_means_the_same_value_nan_included_and_zero_signed() -> None:
    assert same(math.nan, math.nan) and same_list([1.0, math.nan, None], [1.0, math.nan, None])
    assert not same(0.0, -0.0) and not same_list([2.0, 0.0], [2.0, -0.0])
    assert not same(None, 0.0) and not same_list([None], [0.0])
    assert not same_list([1.0], [1.0, 2.0]) and not same_list(None, [])
