"""Runs side by side: the run list's search, filters, rename and delete; comparing runs on
one step axis; and the view's state in a URL that survives a reload."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from tests.serverproc import ServerProc

from .conftest import ARTIFACTS, Page
from .dash import compared, finished, header, ingest, steps, wait_for

pytestmark = pytest.mark.browser

EVIL = "<b onmouseover=alert(1)>evil</b> & co"


async def store(server: ServerProc, run: str, name: str, n: int, *, t: float,
                missed: tuple[int, int] | None = None, end: bool = True,
                loss: bool = False) -> list[Any]:
    """A run of ``n`` steps started at ``t`` (the list sorts by it); finished if ``end``;
    with a loss of ``1 / (step + 1)`` if ``loss``."""
    sent = steps(n, missed=missed, t0=t)
    if loss:
        sent = [s.model_copy(update={"loss": 1.0 / (s.step + 1)}) for s in sent]
    recs = finished(run, name, sent)
    recs[0] = header(run, name, t=t)
    await ingest(server.ws, run, recs if end else recs[:-1])
    return sent


async def visible_names(page: Page) -> list[str]:
    return await page.locator("#runs li:visible .name").all_text_contents()


async def test_the_run_list_searches_filters_renames_and_deletes(
        server: ServerProc, page: Page) -> None:
    await store(server, "a", "alpha baseline", 30, t=1_700_000_000.0)
    await store(server, "b", "beta lr 3e-4", 60, t=1_700_000_100.0, missed=(20, 40))
    await store(server, "c", "gamma cut", 10, t=1_700_000_200.0, end=False)
    await page.goto(server.http + "/")
    await page.locator("#runs li").nth(2).wait_for()
    assert await visible_names(page) == ["gamma cut", "beta lr 3e-4", "alpha baseline"]

    await page.locator("#run-search").fill("BETA")
    assert await visible_names(page) == ["beta lr 3e-4"]
    assert await page.locator("#run-count").text_content() == "1 of 3"
    await page.locator("#run-search").fill("zzz")
    assert await visible_names(page) == []
    assert await page.locator("#runs-none-match").is_visible()
    await page.locator("#run-search").fill("")
    # its stream closed without an End: the server calls it interrupted (after 1 s here)
    await wait_for(lambda: _status(server, "c", "interrupted"))
    await page.locator("#run-status-filter").select_option("interrupted")
    assert await visible_names(page) == ["gamma cut"]
    await page.locator("#run-status-filter").select_option("")
    await page.locator("#run-has-findings").check()
    assert await visible_names(page) == ["beta lr 3e-4"]
    await page.locator("#run-has-findings").uncheck()

    # Rename in place: Enter saves; the server keeps it and every list shows it.
    item = page.locator("#runs li[data-run='a']")
    await item.hover()
    await item.locator("button.act-rename").click()
    await item.locator("input.rename").fill(EVIL)
    await item.locator("input.rename").press("Enter")
    await wait_for(lambda: _text(item.locator(".name"), EVIL))
    assert server.get("/api/runs/a")["name"] == EVIL
    # A name another run has is refused, and says why; Escape gives up.
    await item.locator("button.act-rename").click()
    await item.locator("input.rename").fill("beta lr 3e-4")
    await item.locator("input.rename").press("Enter")
    await page.locator("#toast").wait_for()
    assert "already named 'beta lr 3e-4'" in await page.locator("#toast").text_content()
    await item.locator("input.rename").press("Escape")
    assert await item.locator(".name").text_content() == EVIL
    assert await item.locator(".badge").text_content() == "finished"
    assert await item.locator(".name").is_visible()
    assert server.get("/api/runs/a")["name"] == EVIL

    # Delete asks first, naming the run; Cancel keeps it.
    await item.locator("button.act-delete").click()
    dialog = page.locator("#confirm-delete")
    await dialog.wait_for()
    assert EVIL in await dialog.text_content()
    await page.screenshot(path=str(ARTIFACTS / "web-delete-confirmation.png"))
    await dialog.locator("button[value='cancel']").click()
    assert server.get("/api/runs/a")["id"] == "a"
    await item.locator("button.act-delete").click()
    await dialog.locator("button[value='delete']").click()
    await wait_for(lambda: _count(page.locator("#runs li[data-run='a']"), 0))
    with pytest.raises(urllib.error.HTTPError) as e:
        server.get("/api/runs/a")
    assert e.value.code == 404
    assert await page.locator("img, b").count() == 0
    assert page.dialogs == [] and page.errors == []


async def _status(server: ServerProc, run: str, want: str) -> bool:
    return bool(server.get(f"/api/runs/{run}")["status"] == want)


async def _text(loc: Any, want: str) -> bool:
    return await loc.text_content() == want


async def _count(loc: Any, n: int) -> bool:
    return await loc.count() == n


async def test_compare_overlays_runs_on_one_step_axis_with_a_legend_naming_each(
        server: ServerProc, page: Page) -> None:
    a = await store(server, "ra", EVIL, 80, t=1_700_000_000.0, missed=(30, 50))
    b = await store(server, "rb", "fixed run", 120, t=1_700_000_100.0, loss=True)
    await page.goto(server.http + "/")
    await page.locator("#runs li").nth(1).wait_for()
    await page.locator("#runs li[data-run='ra'] input.pick").check()
    assert await page.locator("#btn-compare").is_disabled()
    await page.locator("#runs li[data-run='rb'] input.pick").check()
    await page.locator("#btn-compare").click()
    await wait_for(lambda: _has_runs(page, {"ra", "rb"}))
    assert "compare=ra%2Crb" in page.url or "compare=ra,rb" in page.url
    await _check_overlay(page, a, b)
    legend = await page.locator("#compare-legend .lg").all_text_contents()
    assert EVIL in legend and "fixed run" in legend
    verdicts = await page.locator("#compare-runs td.v").all_text_contents()
    assert verdicts[0].startswith("missed reset steps 31–49") and verdicts[1] == "clean"
    await page.screenshot(path=str(ARTIFACTS / "web-compare.png"))
    # A shared link (or a reload) shows the same comparison.
    await page.reload()
    await wait_for(lambda: _has_runs(page, {"ra", "rb"}))
    await _check_overlay(page, a, b)
    assert await page.locator("img, b").count() == 0
    assert page.errors == []


async def _has_runs(page: Page, runs: set[str]) -> bool:
    return set(await compared(page)) == runs and await page.evaluate(
        "document.getElementById('compare-legend').children.length > 0")


async def _check_overlay(page: Page, a: list[Any], b: list[Any]) -> None:
    for field in ("norm", "drift"):
        got = await compared(page, field)
        for run, sent in (("ra", a), ("rb", b)):
            xs, ys = got[run]
            assert xs == [s.step for s in sent]
            assert ys == pytest.approx([getattr(s, field) for s in sent])
    # the loss of the run that recorded one; none drawn for the other
    got = await compared(page, "loss")
    assert got["rb"] == ([s.step for s in b], pytest.approx([s.loss for s in b]))
    assert set(got["ra"][1]) == {None}
    # one step axis: every trace on x, norm over drift over loss
    axes = await page.evaluate("""Array.from(document.getElementById('compare-chart').data)
      .map(t => [t.meta.field, t.xaxis, t.yaxis])""")
    assert {tuple(x) for x in axes} == {("norm", "x", "y"), ("drift", "x", "y2"),
                                        ("loss", "x", "y3")}
    legend = await page.locator("#compare-legend").text_content()
    assert legend is not None and "bottom: loss" in legend


async def test_the_run_its_zoom_finding_and_scale_survive_a_reload(
        server: ServerProc, page: Page) -> None:
    await store(server, "u", "url state", 300, t=1_700_000_000.0, missed=(150, 200))
    await page.goto(f"{server.http}/?run=u")
    await page.locator(".finding").click()
    await page.locator("#chk-log").check()
    await wait_for(lambda: _url_has(page, "zoom=", "finding=", "log=1"))
    url = page.url
    before = await _zoom(page)
    await page.reload()
    await page.wait_for_function("document.body.dataset.snapshot >= 1")
    assert page.url == url
    await wait_for(lambda: _zoom_is(page, before))
    assert await page.locator(".finding.active").count() == 1
    assert await page.evaluate("document.getElementById('chart')._fullLayout.yaxis.type") == "log"
    # the link works in a fresh page too (a colleague opening it)
    fresh = await page.context.new_page()
    await fresh.goto(url)
    await fresh.locator(".finding.active").wait_for()
    await wait_for(lambda: _zoom_is(fresh, before))
    await fresh.close()
    # Whole run drops the zoom from the URL.
    await page.locator("#btn-reset").click()
    await wait_for(lambda: _url_lacks(page, "zoom="))
    assert page.errors == []


async def _url_has(page: Page, *parts: str) -> bool:
    return all(p in page.url for p in parts)


async def _url_lacks(page: Page, part: str) -> bool:
    return part not in page.url


async def _zoom(page: Page) -> list[float] | None:
    return await page.evaluate("""(() => { const a = document.getElementById('chart').layout;
      return a && a.xaxis && !a.xaxis.autorange ? a.xaxis.range : null; })()""")


async def _zoom_is(page: Page, want: list[float]) -> bool:
    got = await _zoom(page)
    return got is not None and abs(got[0] - want[0]) <= 0.1 and abs(got[1] - want[1]) <= 0.1


def _patch(server: ServerProc, run: str, body: dict[str, Any]) -> int:
    req = urllib.request.Request(f"{server.http}/api/runs/{run}", method="PATCH",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return int(r.status)


async def test_a_rename_elsewhere_reaches_an_open_run_and_its_list_entry(
        server: ServerProc, page: Page) -> None:
    await store(server, "r", "before", 20, t=1_700_000_000.0)
    await page.goto(f"{server.http}/?run=r")
    await page.wait_for_function("document.body.dataset.snapshot >= 1")
    assert _patch(server, "r", {"name": "after"}) == 200
    await wait_for(lambda: _text(page.locator("#run-name"), "after"))
    await wait_for(lambda: _text(page.locator("#runs li[data-run='r'] .name"), "after"))
    assert page.errors == []
