"""The vendored plotly.js partial bundle (web/vendor/) draws every chart the dashboard has.

A partial bundle leaves trace types out; plotly draws an unregistered type as nothing,
without an error, so this checks what was drawn, chart by chart.
"""

from __future__ import annotations

import pytest

from gradwatch.wire import End
from tests.packaging.vendor import pin
from tests.serverproc import ServerProc

from .conftest import Page
from .dash import header, ingest, optimizer, steps

pytestmark = pytest.mark.browser

DRAWN = """id => {
  const gd = document.getElementById(id);
  return (gd._fullData || []).map(t => ({type: t.type, visible: t.visible,
                                         module: t._module ? t._module.name : null}));
}"""


async def test_the_bundle_draws_the_line_charts_and_the_heatmap(
        server: ServerProc, page: Page) -> None:
    sent = steps(80, missed=(30, 45))
    await ingest(server.ws, "bundle", [header("bundle", "bundle run"), optimizer(), *sent,
                                       End(seq=sent[-1].seq + 1, t=1_700_000_100.0, steps=80)])
    await page.goto(f"{server.http}/?run=bundle")
    await page.wait_for_function(
        "window.Plotly && ['chart', 'heatmap'].every(id => "
        "(document.getElementById(id)._fullData || []).length > 0)", timeout=20_000)
    assert await page.evaluate("Plotly.version") == pin()["version"]

    chart = await page.evaluate(DRAWN, "chart")
    assert {t["type"] for t in chart} == {"scatter"}
    heatmap = await page.evaluate(DRAWN, "heatmap")
    assert [t["type"] for t in heatmap] == ["heatmap"]
    # A type missing from the bundle gets no module and is switched off, silently.
    for t in chart + heatmap:
        assert t["module"] == t["type"], t
    assert heatmap[0]["visible"] is True
    # And pixels: line paths on the main chart, the heatmap's image, the step shapes.
    assert await page.locator("#chart .scatterlayer path.js-line").count() > 0
    assert await page.locator("#heatmap .hm image").count() == 1
    assert await page.locator("#chart .shapelayer path").count() > 0
    assert page.errors == []
