"""The dashboard's copy of the server's row rules, run in Chromium against the fixture the
Python rules answer (tests/server/rows_fixture.json): which rows must never be lost, and
which rows min/max downsampling keeps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.serverproc import ServerProc

from .conftest import Page

pytestmark = pytest.mark.browser

FIXTURE = json.loads((Path(__file__).parents[1] / "server" / "rows_fixture.json").read_text())

RUN_RULES = """async (fx) => {
  const m = await import("/static/js/series.js");
  const one = (ss) => { const into = new Map(); m.ingest(ss, into); return [...into.values()][0]; };
  const s = one(fx.rows);
  const copied = new Map();
  m.appendRows(s, 0, copied);
  const again = [...copied.values()][0];
  return {
    mustKeep: fx.rows.step.map((_, i) => m.mustKeep(fx.rows, i)),
    flagged: s.step.map((_, i) => s.flagged(i)),
    copiedFlagged: again.step.map((_, i) => again.flagged(i)),
    cases: fx.downsample.map((c) => {
      const t = one(fx.rows);
      const dropped = m.compact(t, c.max_points);
      return { steps: t.step, dropped, norms: t.norm.length,
               bucket: m.bucketSize(fx.rows.step[0], fx.rows.step.at(-1), c.max_points) };
    }),
  };
}"""


async def test_the_dashboard_keeps_and_downsamples_rows_as_the_server_does(
        server: ServerProc, page: Page) -> None:
    await page.goto(server.http + "/healthz")
    got = await page.evaluate(RUN_RULES, FIXTURE)
    assert got["mustKeep"] == FIXTURE["must_keep"]
    assert got["flagged"] == FIXTURE["must_keep"] == got["copiedFlagged"]
    n = len(FIXTURE["rows"]["step"])
    for case, js in zip(FIXTURE["downsample"], got["cases"], strict=True):
        assert js["steps"] == case["kept"], case["max_points"]
        assert js["norms"] == len(case["kept"])  # every column compacted alike
        assert js["dropped"] == (len(case["kept"]) < n)
        if case["bucket"] > 1:
            assert js["bucket"] == case["bucket"]
    assert page.errors == []
