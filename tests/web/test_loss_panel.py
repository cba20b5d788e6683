"""The loss, learning rate and logged values of a run with no code but ``watch()``, drawn in
Chromium on the step axis of the norms, compared with what the training loop computed."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.serverproc import ServerProc

from .conftest import Page
from .dash import finished, ingest, optimizer, plotted, steps, wait_for
from .dash import header as run_header

pytestmark = pytest.mark.browser

AXES = """() => { const gd = document.getElementById('chart');
  const out = {};
  for (const t of gd.data) {
    const f = t.meta && (t.meta.field || (t.meta.scalar && 'scalar'));
    if (f) out[f] = gd._fullLayout[t.yaxis.replace('y', 'yaxis')].visible !== false
      && t.visible !== false;
  }
  return out; }"""
SCALARS = """() => Array.from(document.getElementById('chart').data)
  .filter(t => t.meta && t.meta.scalar)
  .map(t => ({name: t.meta.scalar, x: Array.from(t.x), y: Array.from(t.y)}))"""


async def test_the_loss_of_a_zero_code_run_is_drawn_beside_the_drift(
        server: ServerProc, page: Page, tmp_path: Path) -> None:
    want_path = tmp_path / "want.json"
    r = await asyncio.to_thread(
        subprocess.run, [sys.executable, str(Path(__file__).with_name("loss_script.py")),
                         server.ws, str(want_path)],
        capture_output=True, text=True, timeout=180,
        env={**os.environ, "GRADWATCH_SPOOL_DIR": str(tmp_path / "spool")})
    assert r.returncode == 0, r.stdout + r.stderr
    want = json.loads(want_path.read_text())

    await page.goto(f"{server.http}/?run=loss-run")

    async def drawn() -> bool:
        got = await plotted(page, "loss")
        return "SGD#0" in got and len(got["SGD#0"][0]) == 60

    await wait_for(drawn, timeout=30)
    xs, ys = (await plotted(page, "loss"))["SGD#0"]
    assert xs == list(range(60))
    # what the loop passed to backward, to float32's 9 digits where a sum is a float32 value
    assert ys == pytest.approx(want["loss"], rel=1e-8)
    lr_x, lr_y = (await plotted(page, "lr"))["SGD#0"]
    assert lr_x == xs and lr_y == pytest.approx(want["lr"])
    norm_x, _ = (await plotted(page, "norm"))["SGD#0"]
    assert norm_x == xs  # one step axis

    async def logged() -> list[dict] | None:
        got = await page.evaluate(SCALARS)
        return got or None

    (acc,) = await wait_for(logged)
    assert acc["name"] == "acc" and acc["x"] == want["acc_step"]
    assert acc["y"] == pytest.approx(want["acc"])
    shown = await page.evaluate(AXES)
    # the smoothed lines are drawn only while the smoothing slider is above 0
    assert shown == {"norm": True, "fresh_norm": True, "drift": True, "stale": True,
                     "loss": True, "lr": True, "scalar": True, "norm_smooth": False,
                     "loss_smooth": False}
    legend = await page.locator("#legend").text_content()
    assert "loss" in legend and "acc" in legend
    assert page.errors == []


async def test_a_run_without_loss_shows_no_loss_panel(server: ServerProc, page: Page) -> None:
    await ingest(server.ws, "old", [run_header("old", "old run"), optimizer(),
                                    *steps(30, first_seq=2)])
    await page.goto(f"{server.http}/?run=old")

    async def drawn() -> bool:
        got = await plotted(page, "norm")
        return "SGD#0" in got and len(got["SGD#0"][0]) == 30

    await wait_for(drawn)
    shown = await page.evaluate(AXES)
    assert shown["norm"] and shown["drift"]
    assert not shown["loss"] and not shown["lr"] and "scalar" not in shown
    legend = await page.locator("#legend").text_content()
    assert "loss" not in legend and " lr" not in legend
    assert page.errors == []


async def test_a_labelled_optimizer_is_named_by_its_label_wherever_it_is_named(
        server: ServerProc, page: Page) -> None:
    """Findings name an optimizer as the user's code holds it (``d_opt``); the header, the
    legend, the readout and the parameters' choice say the same, not its id (``SGD#0``)."""
    adam = optimizer("Adam#1")
    adam.seq = 2
    recs = finished("named", "named run", [*steps(20, first_seq=3),
                                           *steps(20, first_seq=23, opt="Adam#1")],
                    before=[adam])
    recs[1].label = "d_opt"  # what the user's code calls the SGD optimizer
    await ingest(server.ws, "named", recs)
    await page.goto(f"{server.http}/?run=named")
    await page.locator("#slider:enabled").wait_for(timeout=20_000)

    async def drawn() -> bool:
        got = await plotted(page, "norm")
        return len(got.get("SGD#0", ([], []))[0]) == 20 and "Adam#1" in got

    await wait_for(drawn)
    facts = await page.locator("#run-facts").text_content()
    assert "optimizersd_opt, Adam#1" in facts, facts
    legend = await page.locator("#legend").text_content()
    assert "d_opt ‖grad‖" in legend and "Adam#1 ‖grad‖" in legend and "SGD#0" not in legend
    await page.locator("#slider").fill("10")
    readout = await page.locator("#readout").text_content()
    assert "d_opt: " in readout and "Adam#1: " in readout and "SGD#0" not in readout, readout
    choices = await page.locator("#sel-opt option").all_text_contents()
    assert sorted(choices) == ["Adam#1", "d_opt"], choices
    assert page.errors == []
