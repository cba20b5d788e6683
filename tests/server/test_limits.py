"""The ingest gate directly: connection cap, one rate budget per address, bounded memory."""

from __future__ import annotations

import pytest

from gradwatch.server.errors import TooManyConnections, TooManyFrames
from gradwatch.server.limits import IngestGate


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_connections_of_one_address_share_one_budget_and_the_cap_counts_all() -> None:
    clock = Clock()
    gate = IngestGate(max_connections=3, rate=1.0, clock=clock)
    (a1, _), (a2, _) = gate.open("10.0.0.1"), gate.open("10.0.0.1")
    b, trial = gate.open("10.0.0.2")
    assert trial  # the last of 3 is kept for owned streams
    assert a1 is a2 and a1 is not b
    with pytest.raises(TooManyConnections, match="limit is 3"):
        gate.open("10.0.0.3")
    a1.take()
    a2.take()  # a burst of twice the rate, over both connections
    with pytest.raises(TooManyFrames, match="from this address"):
        a1.take()
    b.take()  # another address has its own
    gate.close("10.0.0.1")
    assert gate.open("10.0.0.3") is not None
    clock.now += 1.0
    a2.take()  # refilled at 1 frame/s


def test_idle_addresses_are_forgotten_but_not_those_still_limited() -> None:
    clock = Clock()
    gate = IngestGate(max_connections=10_000, rate=1.0, clock=clock)
    busy, _ = gate.open("busy")
    busy.take()
    busy.take()
    gate.close("busy")
    for i in range(IngestGate._FORGET_AFTER):
        gate.open(f"10.1.{i // 256}.{i % 256}")
        gate.close(f"10.1.{i // 256}.{i % 256}")
    gate.open("one-more")  # past the limit: refilled, closed addresses are forgotten
    assert len(gate._buckets) < 10
    assert gate.open("busy")[0] is busy  # its empty bucket is kept: no fresh budget
    with pytest.raises(TooManyFrames):
        busy.take()


def test_a_quarter_of_the_connections_is_kept_for_owned_streams() -> None:
    gate = IngestGate(max_connections=8, rate=1.0)
    assert gate.reserved == 2
    assert [gate.open("127.0.0.1")[1] for _ in range(6)] == [False] * 6
    assert gate.open("127.0.0.1")[1]  # on trial: must prove a stream it owns
    gate.close("127.0.0.1", trial=True)  # it did not
    assert gate.open("127.0.0.1")[1]
    gate.proven()  # this one did: it stays, and the room left is on trial again
    assert gate.open("127.0.0.1")[1]
    with pytest.raises(TooManyConnections):
        gate.open("127.0.0.1")
    gate.close("127.0.0.1")  # a general one left, but the proven one holds its room
    assert gate.open("127.0.0.1")[1]
    gate.close("127.0.0.1", trial=True)
    gate.close("127.0.0.1")
    gate.close("127.0.0.1")
    assert not gate.open("127.0.0.1")[1]  # now the next one needs no proof
