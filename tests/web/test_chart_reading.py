"""Charts that read right: zoom fits the y axes to the window (also while live), a clicked
finding lands on a step that shows its values, one name per reset kind, a heatmap scale
that reaches the largest drift, and exports named after the run that carry its name."""

from __future__ import annotations

import csv
import io
import math
import struct
from pathlib import Path
from typing import Any

import pytest
import websockets

from gradwatch.wire import IngestBatch
from tests.serverproc import ServerProc

from .conftest import ARTIFACTS, Page
from .dash import finished, header, ingest, optimizer, plotted, steps, wait_for

pytestmark = pytest.mark.browser


def fmt(x: float) -> str:
    """The dashboard's number format (format.js fmt) for values in [1e-3, 1e5)."""
    return f"{x:.3g}"


STRIP_TICKS = """(() => { const l = document.getElementById('chart').layout;
  const k = l && Object.keys(l).find((key) => l[key] && l[key].tickmode === 'array');
  return k ? l[k].ticktext : null; })()"""
"""The event strip's row names; null until the chart is drawn (the player can be ready
first: under load the first draw comes later)."""
STRIP_ID = """(() => { const l = document.getElementById('chart').layout;
  return Object.keys(l).find((key) => l[key] && l[key].tickmode === 'array')
    .replace('axis', ''); })()"""

async def axis_range(page: Page, axis: str) -> list[float] | None:
    return await page.evaluate(f"""(() => {{ const a = document.getElementById('chart').layout
      .{axis}; return a && !a.autorange && a.range ? a.range : null; }})()""")


async def drag_zoom(page: Page, frac: tuple[float, float]) -> None:
    """Drag a zoom box across the top panel, from and to these fractions of its width."""
    box = await page.locator("#chart .draglayer .xy .nsewdrag").first.bounding_box()
    assert box is not None
    y = box["y"] + box["height"] / 2
    await page.mouse.move(box["x"] + box["width"] * frac[0], y)
    await page.mouse.down()
    await page.mouse.move(box["x"] + box["width"] * (frac[0] + frac[1]) / 2, y + 5, steps=4)
    await page.mouse.move(box["x"] + box["width"] * frac[1], y + 8, steps=4)
    await page.mouse.up()


async def test_zooming_a_live_run_fits_the_y_axes_to_the_steps_in_view(
        server: ServerProc, page: Page) -> None:
    run = "zoom-live"
    sent = steps(200, missed=(80, 200))
    async with websockets.connect(f"{server.ws}/ws/ingest") as ws:
        await ws.send(IngestBatch(run=run, records=[header(run, "zoom live"), optimizer(),
                                                    *sent[:120]]).model_dump_json())
        await page.goto(f"{server.http}/?run={run}")
        await wait_for(lambda: _points(page, 120))
        await drag_zoom(page, (0.02, 0.3))
        x0, x1 = await wait_for(lambda: axis_range(page, "xaxis"))
        assert 0 <= x0 < x1 < 75  # a window of the healthy steps only

        async def fits() -> bool:
            inside = [s for s in sent if x0 <= s.step <= x1 and s.step < await _last(page)]
            norm, drift = await axis_range(page, "yaxis"), await axis_range(page, "yaxis2")
            if not norm or not drift:
                return False
            top = max(max(s.norm, s.fresh_norm) for s in inside)
            # fitted: the window's largest value near the top, not the run's (about 40)
            return (top < norm[1] <= top * 1.2 and norm[0] <= min(s.fresh_norm for s in inside)
                    and 1.0 <= drift[1] <= 1.3)

        await wait_for(fits)
        # Steps keep coming (the forgotten reset piles gradients up): the window stays fitted.
        await ws.send(IngestBatch(run=run, records=sent[120:]).model_dump_json())
        await wait_for(lambda: _last_is(page, 199))
        assert await fits()
        norm = await axis_range(page, "yaxis")
        assert norm is not None and norm[1] < 2 < max(s.norm for s in sent)
        await page.screenshot(path=str(ARTIFACTS / "web-zoomed-live.png"))
        # Whole run: plotly fits everything again.
        await page.locator("#btn-reset").click()
        await wait_for(lambda: _autorange(page))
    assert page.errors == []


async def _points(page: Page, n: int) -> bool:
    return sum(len(x) for x, _ in (await plotted(page)).values()) >= n


async def _last(page: Page) -> int:
    xs = (await plotted(page)).get("SGD#0", ([-1], []))[0]
    return int(xs[-1]) + 1 if xs else 0


async def _last_is(page: Page, step: int) -> bool:
    return await _last(page) == step + 1


async def _autorange(page: Page) -> bool:
    return bool(await page.evaluate("(() => { const l = document.getElementById('chart').layout;"
                                    " return l.xaxis.autorange && l.yaxis.autorange; })()"))


async def test_a_reset_kind_has_one_name_everywhere(server: ServerProc, page: Page) -> None:
    sent = steps(40, missed=(20, 30))
    recs = finished("names", "names", sent)
    recs[1].label = "model_opt"  # what the user's code calls the optimizer
    await ingest(server.ws, "names", recs)
    await page.goto(f"{server.http}/?run=names")
    await page.locator("#slider:enabled").wait_for()
    ticks = await wait_for(lambda: page.evaluate(STRIP_TICKS))
    # only the rows this run has; the resets named as the findings name the optimizer
    assert ticks == ["stale grads", "model_opt.zero_grad()"]
    (f,) = server.get("/api/runs/names/findings")["findings"]
    assert f["optimizer"] == "model_opt"
    await page.locator("#slider").fill("5")
    assert (await page.locator("#readout").text_content()).endswith("· model_opt.zero_grad()")
    # Each label fits its margin: none is cut off by the plot's left edge.
    strip = await page.evaluate(STRIP_ID)  # the axis under every panel: "y6"
    labels = await page.evaluate(f"""Array.from(document.querySelectorAll(
      '#chart .yaxislayer-above .{strip}tick text')).map(t => t.getBoundingClientRect().left -
      document.getElementById('chart').getBoundingClientRect().left)""")
    assert len(labels) == 2 and min(labels) >= 0
    text = await page.evaluate("document.body.innerText")
    assert "optimizer_zero_grad" not in text
    assert page.errors == []


async def test_the_heatmap_scale_reaches_the_largest_drift_and_keeps_small_ones_apart(
        server: ServerProc, page: Page) -> None:
    sent = steps(300, missed=(100, 200))
    await ingest(server.ws, "heat", finished("heat", "heat", sent))
    await page.goto(f"{server.http}/?run=heat")
    await page.wait_for_function("(document.getElementById('heatmap')._fullData || []).length")
    trace = await page.evaluate("""(() => {
      const t = document.getElementById('heatmap').data[0];
      return {zmin: t.zmin, zmax: t.zmax, ticks: t.colorbar.ticktext}; })()""")
    top = max(s.drift for s in sent)  # each parameter's drift is the step's (dash.steps)
    assert trace["zmax"] == pytest.approx(math.log10(top))
    assert trace["ticks"][-1] == f"max {fmt(top)}"
    assert trace["zmin"] <= 0  # drift 1.0 (healthy) is inside the scale, not at its floor
    assert "1" in trace["ticks"] and "10" in trace["ticks"]
    cell = await page.locator("#params-body tr").first.locator("td").nth(3).text_content()
    assert cell == fmt(top)  # the table's max drift is the scale's top
    assert page.errors == []


OPT = 'G "main", v2'


async def test_exports_carry_the_run_name_and_read_back(server: ServerProc, page: Page,
                                                       tmp_path: Path) -> None:
    name = 'evil, "quoted" <run>'
    sent = steps(60, missed=(20, 40), opt=OPT)
    await ingest(server.ws, "exp", finished("exp", name, sent, OPT))
    await page.goto(f"{server.http}/?run=exp")
    await page.locator(".finding").wait_for()
    await page.wait_for_function("window.Plotly && document.getElementById('chart').data")
    files: dict[str, Any] = {}
    for fmt_ in ("csv", "jsonl", "png"):
        async with page.expect_download() as info:
            await page.locator(f"#btn-{fmt_}").click()
        dl = await info.value
        files[fmt_] = (dl.suggested_filename, Path(await dl.path()))
    for fmt_, (fname, _) in files.items():
        assert fname == f"evil-quoted-run-exp.{fmt_}"

    rows = list(csv.reader(io.StringIO(files["csv"][1].read_text())))
    head, body = rows[0], rows[1:]
    col = {c: i for i, c in enumerate(head)}
    assert len(body) == 60 and all(len(r) == len(head) for r in body)
    assert {r[col["opt"]] for r in body} == {OPT}
    assert [float(r[col["norm"]]) for r in body] == pytest.approx([s.norm for s in sent])

    png = files["png"][1].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", png[16:24]) == (1400, 820)
    (ARTIFACTS / "web-export.png").write_bytes(png)
    fig = await page.evaluate("""(() => { const f = window.gradwatch.view.pngFigure();
      return {title: f.layout.title.text, legend: f.layout.showlegend,
              names: f.data.filter(t => t.showlegend).map(t => t.name),
              labels: f.layout.shapes.filter(s => s.label).map(s => s.label.text)}; })()""")
    # plotly reads tags in labels: the name is escaped to show as typed
    assert fig["title"].startswith("evil, \"quoted\" &lt;run&gt;")
    assert fig["legend"] is True
    assert f"{OPT} ‖grad‖" in fig["names"] and f"{OPT} drift" in fig["names"]
    assert any(n.startswith("missed reset band: ") for n in fig["names"])
    assert fig["labels"] == ["missed reset"]
    assert page.errors == []
