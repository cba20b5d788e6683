"""What a new user sees first, read back from what Chromium drew (issue 31): a stored run
opened cold from its URL draws its loss and learning-rate lines (the SVG paths of those
subplots, not the figure's data), on the page and in the PNG export.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from gradwatch.wire import End, Step
from tests.serverproc import ServerProc

from .conftest import Page
from .dash import header, ingest, optimizer, steps, wait_for

pytestmark = pytest.mark.browser

N = 200

# The points of each drawn line of a subplot ("xy3": the step axis and the third y axis):
# plotly draws a trace's line as one <path class="js-line" d="M..L..L..">.
DRAWN = """([root, subplot]) => Array.from(document.querySelectorAll(
    `${root} .cartesianlayer .subplot.${subplot} .scatterlayer .trace path.js-line`))
  .map(p => (p.getAttribute('d') || '').split(/[ML]/).filter(s => s.trim()).length)"""

# The export as drawn: the run's PNG figure (exporting.runFigure) plotted in a box the size
# of the PNG, so its SVG can be read like the page's.
EXPORT = """async () => {
  const { drawFigure, runFigure } = await import('/static/js/exporting.js');
  const run = { id: 'cold', name: document.getElementById('run-name').textContent,
                status: 'finished', steps: 200, started: 1700000000 };
  const fig = runFigure(document.getElementById('chart'), run, 0);
  let box = document.getElementById('export-probe');
  if (box) { window.Plotly.purge(box); box.remove(); }
  box = document.createElement('div');
  box.id = 'export-probe';
  box.style.cssText = `position:absolute;left:0;top:0;width:${fig.layout.width}px;` +
    `height:${fig.layout.height}px`;
  document.body.append(box);
  await drawFigure(box, fig);
  return fig.layout.width; }"""


def lossy(n: int) -> list[Step]:
    """Steps with a falling, noisy loss and a cosine learning-rate schedule."""
    out = []
    for s in steps(n):
        i = s.step
        s.loss = 2.0 * math.exp(-i / 60) + 0.1 * math.sin(i * 1.7)
        s.lr = [0.1 * 0.5 * (1 + math.cos(math.pi * i / n))]
        out.append(s)
    return out


async def stored_run(server: ServerProc) -> None:
    sent = lossy(N)
    await ingest(server.ws, "cold", [header("cold", "cold-start"), optimizer(), *sent,
                                     End(seq=sent[-1].seq + 1, t=sent[-1].t + 1, steps=N)])


async def drawn_points(page: Any, root: str, subplot: str) -> list[int]:
    return await page.evaluate(DRAWN, [root, subplot])


async def test_a_stored_run_opened_cold_draws_its_loss_and_lr_lines(
        server: ServerProc, page: Page) -> None:
    await stored_run(server)
    await page.goto(f"{server.http}/?run=cold")

    async def lines() -> dict[str, list[int]] | None:
        got = {s: await drawn_points(page, "#chart", s) for s in ("xy", "xy3", "xy4")}
        return got if got["xy"] and max(got["xy"]) > 0 else None

    got = await wait_for(lines, timeout=30)
    # The norm panel draws its lines, and so do the loss (y3) and lr (y4) panels, with a
    # point per step (the loss wiggles: plotly cannot merge its points).
    assert max(got["xy"]) >= N // 2, got
    assert got["xy3"] and max(got["xy3"]) >= N // 2, f"loss panel drawn empty: {got}"
    assert got["xy4"] and max(got["xy4"]) >= 10, f"lr panel drawn empty: {got}"

    # The PNG export has the same lines (no empty band where the loss was).
    await page.evaluate(EXPORT)
    exported = {s: await drawn_points(page, "#export-probe", s) for s in ("xy3", "xy4")}
    assert max(exported["xy3"]) >= N // 2 and max(exported["xy4"]) >= 10, exported
    assert page.errors == []


# Boxes of what a user reads, for the geometry checks below.
BOXES = """sel => Array.from(document.querySelectorAll(sel)).filter(e => e.getClientRects().length)
  .map(e => { const r = e.getBoundingClientRect();
    return {x: r.x, y: r.y, w: r.width, h: r.height, text: e.textContent,
            sw: e.scrollWidth, cw: e.clientWidth}; })"""

# The y tick labels of each panel of a figure, per axis ("y", "y2", ...).
TICKS = """root => { const out = {};
  for (const t of document.querySelectorAll(`${root} .yaxislayer-above .ytick text, ` +
      `${root} .yaxislayer-above [class*="tick"] text`)) {
    const g = t.closest('g[class$="tick"]');
    const ax = g ? g.getAttribute('class').replace('tick', '') : '?';
    const r = t.getBoundingClientRect();
    if (!r.height || !t.textContent) continue;
    (out[ax] = out[ax] || []).push({y: r.y, h: r.height, text: t.textContent});
  }
  return out; }"""


def overlap(a: dict[str, float], b: dict[str, float]) -> bool:
    return (a["x"] < b["x"] + b["w"] and b["x"] < a["x"] + a["w"]
            and a["y"] < b["y"] + b["h"] and b["y"] < a["y"] + a["h"])


def crowded(ticks: list[dict[str, float]]) -> list[tuple[str, str]]:
    """Pairs of tick labels of one axis that overlap vertically."""
    ts = sorted(ticks, key=lambda t: t["y"])
    return [(a["text"], b["text"]) for a, b in zip(ts, ts[1:], strict=False)
            if b["y"] < a["y"] + a["h"] - 0.5]
