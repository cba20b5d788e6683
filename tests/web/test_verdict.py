"""What a user sees first in a run: the verdict with each finding's fix and line above the
fold on a laptop screen, a finding that arrives live announced until dismissed, and a run
that does not exist said to be missing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import websockets

from gradwatch.wire import IngestBatch, Stats
from tests.serverproc import ServerProc

from .conftest import ARTIFACTS, Page
from .dash import FILE, finished, header, in_view, ingest, optimizer, sites, steps, wait_for

pytestmark = pytest.mark.browser


def buggy_run(run: str, name: str, n: int = 200) -> list:
    """A finished run with a missed reset on steps 60-99 and a late reset on 140-169,
    whose records name the lines of the user's loop (dash.sites)."""
    return finished(run, name, steps(n, first_seq=5, missed=(60, 100), late=(140, 170),
                                     where=True), before=sites(2))


@pytest.mark.parametrize("size", [(1280, 720), (1440, 900)])
async def test_the_verdict_and_each_fix_with_its_line_show_without_scrolling(
        server: ServerProc, page: Page, size: tuple[int, int]) -> None:
    await ingest(server.ws, "buggy", buggy_run("buggy", "buggy training"))
    want = server.get("/api/runs/buggy/findings")["findings"]
    assert [f["kind"] for f in want] == ["missed_reset", "late_reset"]
    await page.set_viewport_size({"width": size[0], "height": size[1]})
    await page.goto(f"{server.http}/?run=buggy")
    await page.locator(".finding").nth(1).wait_for()
    await page.wait_for_function("document.body.dataset.snapshot >= 1")

    assert await page.locator("#verdict-title").text_content() == "2 findings"
    await in_view(page, "#verdict-title")
    for sel in (".finding .kind", ".finding .opt", ".finding .steps", ".finding .at",
                ".finding .fix"):
        await in_view(page, sel)
    cards = page.locator(".finding")
    # The line to change first: the backward the missing reset goes before (missed), the
    # reset that came between backward and step (late).
    assert await cards.locator(".at").all_text_contents() == ["train.py:40", "train.py:44"]
    assert await cards.locator(".kind").all_text_contents() == ["missed reset", "late reset"]
    for card, f in zip(await cards.all(), want, strict=True):
        text = await card.text_content()
        assert f["fix"] in text and "SGD#0" in text
        assert f"steps {f['first_step']}–{f['last_step']}" in text
    # The rest of the lines, and the full paths, open with the details.
    await cards.first.locator("button.more").click()
    where = await cards.first.locator(".where-list li").all_text_contents()
    assert where[0].startswith(f"{FILE}:40") and any(f"{FILE}:42" in w for w in where)
    await page.screenshot(path=str(ARTIFACTS / f"web-verdict-{size[0]}x{size[1]}.png"))
    assert page.errors == []


async def test_a_clean_run_says_so_first(server: ServerProc, page: Page) -> None:
    await ingest(server.ws, "clean", finished("clean", "clean run", steps(50)))
    await page.set_viewport_size({"width": 1280, "height": 720})
    await page.goto(f"{server.http}/?run=clean")
    await page.wait_for_function("document.getElementById('verdict').dataset.state === 'good'")
    assert await page.locator("#verdict-title").text_content() == "Clean"
    assert "every one of 50 steps" in await page.locator("#verdict-sub").text_content()
    await in_view(page, "#verdict-sub")
    assert await page.locator(".finding").count() == 0
    assert page.errors == []


async def test_a_run_whose_probe_stopped_is_never_shown_clean(server: ServerProc,
                                                              page: Page) -> None:
    sent = steps(20)
    stop = Stats(seq=sent[-1].seq + 1, t=sent[-1].t, disabled="RuntimeError: boom",
                 last_step=19, last_opt="SGD#0")
    records = finished("stopped", "stopped run", sent)
    await ingest(server.ws, "stopped", [*records[:-1], stop,
                                        records[-1].model_copy(update={"seq": stop.seq + 1})])
    want = "nothing judged after step 19 of SGD#0: the probe turned itself off (RuntimeError: boom)"
    assert server.get("/api/runs")["runs"][0]["stopped"] == want
    await page.set_viewport_size({"width": 1280, "height": 720})
    await page.goto(f"{server.http}/?run=stopped")
    await page.wait_for_function("document.getElementById('verdict').dataset.state === 'bad'")
    assert await page.locator("#verdict-title").text_content() == "Judging stopped"
    assert await page.locator("#verdict-sub").text_content() == f"N{want[1:]}."
    assert page.errors == []


async def test_a_finding_that_arrives_live_is_announced_clear_of_the_facts_then_fades(
        server: ServerProc, page: Page) -> None:
    run = "live-bug"
    sent = steps(120, first_seq=5, missed=(70, 110), where=True)
    async with websockets.connect(f"{server.ws}/ws/ingest") as ws:
        first = [header(run, "live bug"), optimizer(), *sites(2), *sent[:50]]
        await ws.send(IngestBatch(run=run, records=first).model_dump_json())
        await page.set_viewport_size({"width": 1280, "height": 720})
        await page.goto(f"{server.http}/?run={run}")
        await page.wait_for_function("document.body.dataset.snapshot >= 1")
        assert await page.locator("#verdict-title").text_content() == "No findings so far"
        await ws.send(IngestBatch(run=run, records=sent[50:]).model_dump_json())
        notice = page.locator(".notice[data-kind='missed_reset']")
        await notice.wait_for(timeout=15_000)
        text = await notice.text_content()
        assert "New finding: missed reset" in text and "SGD#0" in text
        assert "from step 71" in text and "train.py:40" in text  # the line to change
        # Clear of what the user reads about the run: its name, facts and verdict.
        for size in ({"width": 1440, "height": 900}, {"width": 1280, "height": 720}):
            await page.set_viewport_size(size)
            (box,) = await in_view(page, ".notice")
            for sel in (".run-title", "#run-facts", "#verdict"):
                (other,) = await in_view(page, sel)
                apart = (box["x"] >= other["x"] + other["w"] or other["x"] >= box["x"] + box["w"]
                         or box["y"] >= other["y"] + other["h"]
                         or other["y"] >= box["y"] + box["h"])
                assert apart, f"at {size} the notice {box} covers {sel} {other}"
        # The bands on the chart say what they mean.
        band = page.locator("#legend .band[data-kind='missed_reset']")
        assert await band.text_content() == "missed reset band"
        assert "re-applied gradients" in await band.get_attribute("title")
        # Still there long after a plain toast would have gone.
        await asyncio.sleep(7)
        assert await notice.is_visible()
        await page.screenshot(path=str(ARTIFACTS / "web-live-finding-notice-1280x720.png"))
        # "Show" selects the finding and zooms to it; "Dismiss" removes the notice.
        await notice.locator("button.n-show").click()
        await page.locator(".finding.active").wait_for()
        await wait_for(lambda: page.evaluate(
            "!document.getElementById('chart').layout.xaxis.autorange"))
        # A live run has no player, but the finding still lands on its first step.
        s = sent[71]
        await wait_for(lambda: _has(page.locator("#readout"), "step 71 ", f"stale {s.stale}"))
        # The pointer on it kept it; once the pointer leaves, it fades out (the finding
        # stays in the verdict).
        assert await notice.is_visible()
        await page.mouse.move(5, 5)
        await page.locator(".notice.fading").wait_for(timeout=20_000)
        await page.locator(".notice").wait_for(state="detached", timeout=5_000)
        assert await page.locator(".finding").count() >= 1
    assert page.errors == []


async def _has(loc: Any, *parts: str) -> bool:
    text = await loc.text_content() or ""
    return all(p in text for p in parts)


async def test_a_run_opened_with_its_findings_announces_none(server: ServerProc,
                                                              page: Page) -> None:
    await ingest(server.ws, "old", buggy_run("old", "old bug"))
    await page.goto(f"{server.http}/?run=old")
    await page.locator(".finding").nth(1).wait_for()
    await page.wait_for_timeout(500)
    assert await page.locator(".notice").count() == 0
    assert page.errors == []


async def test_an_unknown_run_says_not_found_links_to_the_list_and_shows_when_it_starts(
        server: ServerProc, page: Page) -> None:
    await page.set_viewport_size({"width": 1280, "height": 720})
    await page.goto(f"{server.http}/?run=nope")
    missing = page.locator("#missing")
    await missing.wait_for()
    assert await page.locator("#missing-title").text_content() == "Run not found"
    assert "nope" in await missing.text_content()
    assert await page.locator("#run").is_hidden()
    # The server is up: the indicator does not say offline.
    await page.wait_for_timeout(1000)
    assert await page.locator("#conn").get_attribute("data-state") == "open"
    assert "offline" not in await page.locator("#conn-text").text_content()
    await page.screenshot(path=str(ARTIFACTS / "web-run-not-found-1280x720.png"))
    back = page.locator("#missing-back")
    assert await back.get_attribute("href") == "/"
    await back.click()
    await page.locator("#welcome").wait_for()
    assert page.url == f"{server.http}/"

    # A link opened before its run's first records (replay prints it first) turns into
    # the run once they arrive.
    await page.goto(f"{server.http}/?run=later")
    await missing.wait_for()
    await ingest(server.ws, "later", [header("later", "started late"), optimizer(),
                                      *steps(20)])
    await page.wait_for_function("document.body.dataset.snapshot >= 1", timeout=15_000)
    assert await missing.is_hidden()
    assert await page.locator("#run-name").text_content() == "started late"
    assert page.errors == []
