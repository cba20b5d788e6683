"""The collector pause around bulk validation: off inside, restored after, also on error;
and a server's settled heap."""

from __future__ import annotations

import gc
import json
import subprocess
import sys

import pytest

from gradwatch.gcpause import gc_paused


def test_the_collector_is_off_inside_and_back_after_even_on_an_error() -> None:
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():  # nested: the inner exit leaves it off
            pass
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(ValueError), gc_paused():
        raise ValueError("a bad line")
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off() -> None:
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


SETTLE = r"""
import gc, json, weakref
import gradwatch.server.app  # start-up's heap: the app's modules
from gradwatch.gcpause import SERVER_YOUNG_THRESHOLD, settle_server_heap

class Node:
    pass

before = Node()
before.me = before  # a cycle alive at start-up
gone_before = weakref.ref(before)
settle_server_heap()
frozen = gc.get_freeze_count()
del before
after = Node()
after.me = after  # a cycle made while serving
gone_after = weakref.ref(after)
del after
gc.collect()
print(json.dumps({"frozen": frozen, "threshold": gc.get_threshold(),
                  "young": SERVER_YOUNG_THRESHOLD, "after_freed": gone_after() is None,
                  "before_frozen": gone_before() is not None}))
"""


def test_settling_a_server_heap_freezes_start_up_and_still_collects_what_comes_after(
        ) -> None:
    # In a process of its own: a freeze is process-wide and would hold pytest's heap.
    out = subprocess.run([sys.executable, "-c", SETTLE], capture_output=True, text=True,
                         check=True).stdout
    got = json.loads(out)
    assert got["frozen"] > 10_000  # the modules, schemas and app start-up made
    assert got["threshold"][0] == got["young"]
    assert got["after_freed"]  # a cycle made after settling is collected as ever
    assert got["before_frozen"]  # one alive at settling is out of the collector's reach

