"""The dashboard's names of finding and reset kinds cover the wire's, and its choice of the
line a finding points at is gradwatch.locations.primary's, run in Chromium on the same
findings."""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any, get_args

import pytest

from gradwatch.locations import primary
from gradwatch.wire import FINDING_KINDS, ResetHow, Where
from tests.serverproc import ServerProc

from .conftest import Page

pytestmark = pytest.mark.browser

RUN = """async (cases) => {
  const k = await import("/static/js/kinds.js");
  return {
    known: k.KNOWN_KINDS,
    resets: Object.keys(k.RESET_KINDS),
    labels: Object.fromEntries(Object.keys(k.RESET_KINDS).map((h) => [h, k.resetLabel(h)])),
    primary: cases.map((f) => { const w = k.primaryWhere(f); return w ? f.where.indexOf(w) : -1; }),
    at: k.whereAt({file: "/home/u/proj/train.py", line: 12, role: "step"}),
  };
}"""


def cases() -> list[Any]:
    """Findings of every kind (and one the dashboard does not know) with every order of
    the three roles, some missing."""
    roles = ("backward", "reset", "step")
    wheres: list[list[Where]] = [[]]
    for n in (1, 2, 3):
        for combo in itertools.permutations(roles, n):
            wheres.append([Where(role=r, file=f"/p/{r}.py", line=i + 1)  # type: ignore[arg-type]
                           for i, r in enumerate(combo)])
    kinds = [*FINDING_KINDS, "untrained_params", "idle_optimizer", "some_future_kind"]
    return [SimpleNamespace(kind=k, where=w) for k in kinds for w in wheres]


async def test_the_dashboard_names_every_kind_and_points_at_the_line_check_does(
        server: ServerProc, page: Page) -> None:
    await page.goto(server.http + "/healthz")
    fs = cases()
    got = await page.evaluate(RUN, [{"kind": f.kind, "where": [w.model_dump() for w in f.where]}
                                    for f in fs])
    assert set(FINDING_KINDS) | {"untrained_params", "idle_optimizer"} <= set(got["known"])
    assert set(get_args(ResetHow)) == set(got["resets"])
    assert got["labels"]["optimizer_zero_grad"] == "opt.zero_grad()"
    want = [f.where.index(w) if (w := primary(f)) is not None else -1 for f in fs]
    assert got["primary"] == want
    assert got["at"] == "train.py:12"
    assert page.errors == []
