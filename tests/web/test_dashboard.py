"""The dashboard in a real Chromium against a real ``gradwatch serve`` process."""

from __future__ import annotations

import asyncio
import json
import math
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import websockets

from gradwatch.steplog import StepLogWriter, read_log
from gradwatch.wire import End, IngestBatch, Step
from tests.serverproc import ServerProc

from .conftest import Page
from .dash import header, ingest, optimizer, plotted, plotted_steps, steps, wait_for

pytestmark = pytest.mark.browser


async def test_a_run_named_like_html_shows_as_text_and_runs_no_script(
        server: ServerProc, page: Page) -> None:
    name = "<img src=x onerror=alert(1)>"
    evil_param = "<img src=y onerror=alert(2)>"
    opt = optimizer()
    opt.params = [evil_param, "layer.bias"]
    recs = [header("xss", name), opt, *steps(30, missed=(10, 20))]
    recs.append(End(seq=recs[-1].seq + 1, t=1_700_000_100.0, steps=30))
    await ingest(server.ws, "xss", recs)

    await page.goto(server.http + "/")
    item = page.locator("#runs .name")
    await item.wait_for()
    assert await item.text_content() == name
    await page.locator("#runs a").first.click()
    await page.wait_for_function("document.body.dataset.snapshot >= 1")
    assert await page.locator("#run-name").text_content() == name
    await page.locator("#params-body tr").first.wait_for()
    cells = await page.locator("#params-body td:first-child").all_text_contents()
    assert evil_param in cells
    await page.locator(".finding").first.wait_for()
    # Give an injected onerror handler every chance to run.
    await page.wait_for_timeout(500)
    assert await page.locator("img").count() == 0
    assert page.dialogs == []
    assert page.errors == []


async def test_a_bidi_override_in_names_shows_escaped_and_cannot_reorder_the_row(
        server: ServerProc, page: Page) -> None:
    opt = optimizer()
    opt.params = ["enc.\u202ew", "layer.bias"]  # raw, as the frame's JSON carries them
    recs = [header("bidi", "invoice\u202egnp.exe"), opt, *steps(5)]
    recs.append(End(seq=recs[-1].seq + 1, t=1_700_000_100.0, steps=5))
    await ingest(server.ws, "bidi", recs)

    await page.goto(server.http + "/")
    item = page.locator("#runs .name")
    await item.wait_for()
    assert await item.text_content() == "invoice\\u202egnp.exe"
    await page.locator("#runs a").first.click()
    await page.wait_for_function("document.body.dataset.snapshot >= 1")
    assert await page.locator("#run-name").text_content() == "invoice\\u202egnp.exe"
    await page.locator("#params-body tr").first.wait_for()
    cells = await page.locator("#params-body td:first-child").all_text_contents()
    assert "enc.\\u202ew" in cells
    # a run stored before names were escaped may still hold an override: isolated, it
    # reorders only its own name, never the row or the heading around it
    for sel in ("#runs .name", "#run-name", "#params-body td:first-child"):
        assert await page.locator(sel).first.evaluate(
            "e => getComputedStyle(e).unicodeBidi") == "isolate", sel
    assert page.errors == []


async def test_live_training_steps_reach_the_charts_and_a_finding_appears_while_it_runs(
        server: ServerProc, page: Page, tmp_path: Path) -> None:
    log, stop = tmp_path / "train.jsonl", tmp_path / "stop"
    train = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("train_script.py")), server.ws,
         str(log), str(stop)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        await page.goto(server.http + "/")
        # Starting torch takes a while on a busy machine; the run shows up when it does.
        await wait_for(lambda: _has_run(server, "live-train", train), timeout=90)
        run_link = page.locator("#runs li[data-run='live-train'] a")
        await run_link.wait_for(timeout=10_000)
        await run_link.click()
        await page.wait_for_function("document.body.dataset.snapshot >= 1")
        # Steps keep arriving while the script trains (120 steps at ~30 ms each).
        seen = [await plotted_steps(page)]
        for _ in range(6):
            await asyncio.sleep(0.4)
            seen.append(await plotted_steps(page))
        assert seen[-1] > seen[0], seen
        finding = page.locator(".finding[data-kind='missed_reset']")
        await finding.wait_for(timeout=20_000)
        await wait_for(lambda: _count_is(page, 120), timeout=20)
        # The script is still running (waiting for the stop file): the run is live.
        assert train.poll() is None
        assert await page.locator("#run-status").text_content() == "live"
        text = await finding.text_content()
        expected = [f for f in await _findings(server, "live-train")
                    if f["kind"] == "missed_reset"][0]
        assert expected["message"] in text and expected["fix"] in text
        # named as the script holds it (opt), the reset the window skips named first
        assert "opt" in text and "SGD#0" not in text
        assert f"steps {expected['first_step']}" in text
        assert "Make opt.zero_grad() at" in text

        # Clicking the finding zooms every chart to its steps.
        await finding.click()
        rng = await wait_for(lambda: page.evaluate(
            "(() => { const a = document.getElementById('chart').layout.xaxis;"
            " return a.autorange ? null : a.range; })()"))
        assert rng[0] <= expected["first_step"] and rng[1] >= expected["last_step"]
        assert rng[1] - rng[0] < 120
        await page.locator("#btn-reset").click()
        whole = await wait_for(lambda: page.evaluate(
            "(() => { const gd = document.getElementById('chart');"
            " const n = gd.data.filter(t => t.meta && t.meta.field === 'norm')[0].x.length;"
            " return n === 120 && gd.layout.xaxis.autorange ? gd._fullLayout.xaxis.range"
            " : null; })()"))
        assert whole[0] <= 0 and whole[1] >= 119
    finally:
        stop.touch()
        out, _ = await asyncio.to_thread(train.communicate, None, 90)
    assert train.returncode == 0, out.decode(errors="replace")
    # What the chart drew is what the probe measured (its own step log is the reference).
    want = _log_rows(str(log))
    for field, col in (("norm", 1), ("drift", 2)):
        got = await plotted(page, field)
        assert set(got) == set(want)
        for opt, rows in want.items():
            xs, ys = got[opt]
            assert xs == [row[0] for row in rows]
            assert ys == pytest.approx([_finite(row[col]) for row in rows])
    assert page.errors == []


async def _has_run(server: ServerProc, run: str, proc: subprocess.Popen[bytes]) -> bool:
    if proc.poll() is not None:
        out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
        raise AssertionError(f"training exited early ({proc.returncode}): {out}")

    def get() -> bool:
        with urllib.request.urlopen(f"{server.http}/api/runs") as r:
            return any(x["id"] == run for x in json.load(r)["runs"])

    return await asyncio.to_thread(get)


async def _findings(server: ServerProc, run: str) -> list[dict[str, Any]]:
    def get() -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{server.http}/api/runs/{run}/findings") as r:
            return list(json.load(r)["findings"])

    return await asyncio.to_thread(get)


async def _count_is(page: Page, n: int) -> bool:
    return await plotted_steps(page) == n


async def test_the_page_recovers_after_the_server_restarts(
        server: ServerProc, page: Page) -> None:
    run = "restart"
    first = steps(50)
    await ingest(server.ws, run, [header(run, "restart"), optimizer(), *first])
    await page.goto(f"{server.http}/?run={run}")
    await wait_for(lambda: _count_is(page, 50))

    server.stop()
    await page.wait_for_function("document.getElementById('conn').dataset.state === 'closed'",
                                 timeout=10_000)
    assert "offline" in await page.locator("#conn-text").text_content()
    server.start()
    await page.wait_for_function("document.getElementById('conn').dataset.state === 'open'",
                                 timeout=20_000)
    # The run socket reconnected: steps sent after the restart reach the chart.
    more = steps(30, first_seq=52, first_step=50)
    await ingest(server.ws, run, more)
    await wait_for(lambda: _count_is(page, 80), timeout=15)
    xs, _ = (await plotted(page, "norm"))["SGD#0"]
    assert xs == list(range(80))
    assert await page.locator("#runs .name").all_text_contents() == ["restart"]
    assert page.errors == []


def _log_rows(path: str) -> dict[str, list[tuple[int, float | None, float | None]]]:
    out: dict[str, list[tuple[int, float | None, float | None]]] = {}
    for rec in read_log(path).records:  # a step leaves out a drift its norms imply
        if isinstance(rec, Step):
            out.setdefault(rec.opt, []).append((rec.step, rec.norm, rec.drift))
    return out


async def test_a_token_in_the_page_url_becomes_a_cookie_and_leaves_the_url_and_logs(
        tmp_path: Path, page: Page) -> None:
    token = "s3cret-token"
    srv = ServerProc(tmp_path / "data", None, "--token", token, "--log-level", "info",
                     "--access-log")
    srv.start()
    try:
        recs = [header("tok", "token run"), optimizer(), *steps(20)]
        await ingest(f"{srv.ws}", "tok", recs, token=token)
        await page.goto(f"{srv.http}/?token={token}&run=tok")
        await wait_for(lambda: _count_is(page, 20))
        await page.locator("#params-body tr").first.wait_for()
        # REST calls and both websockets authenticated by the cookie alone.
        assert await page.locator("#conn").get_attribute("data-state") == "open"
        assert token not in page.url and page.url.endswith("/?run=tok")
        href = await page.locator("#runs a").first.get_attribute("href")
        assert href == "/?run=tok"
        [cookie] = await page.context.cookies()
        assert cookie["value"] == token and cookie["httpOnly"]
        assert cookie["sameSite"] == "Strict"
        assert await page.evaluate("document.cookie") == ""  # no script can read it
        log = srv.log.read_text()
        assert "GET /?token=***&run=tok" in log and "/ws/ingest?token=***" in log
        assert token not in log
    finally:
        srv.stop()


async def test_a_replayed_log_draws_the_points_the_log_holds(
        server: ServerProc, page: Page, tmp_path: Path) -> None:
    log = tmp_path / "replayed.jsonl"
    a = steps(120, first_seq=3, opt="SGD#0", missed=(40, 70))
    b = steps(60, first_seq=3 + 120, opt="Adam#1")
    a[10].norm = a[10].drift = float("nan")  # a NaN gradient is data: drawn as a gap
    opt_b = optimizer("Adam#1")
    opt_b.seq = 2
    with StepLogWriter(log) as w:
        for rec in [header("replayed", "replayed run"), optimizer(), opt_b, *a, *b]:
            w.write(rec)
        w.write(End(seq=b[-1].seq + 1, t=1_700_000_100.0, steps=180))
    r = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "gradwatch.cli", "replay", str(log),
                         "--server", server.ws, "--fast"],
        capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    run = re.search(r"as run (\S+)", r.stdout)
    assert run, r.stdout

    await page.goto(f"{server.http}/?run={run.group(1)}")
    await wait_for(lambda: _count_is(page, 180))
    want = _log_rows(str(log))
    for field, col in (("norm", 1), ("drift", 2)):
        got = await plotted(page, field)
        assert set(got) == set(want) == {"SGD#0", "Adam#1"}
        for opt, rows in want.items():
            xs, ys = got[opt]
            assert xs == [row[0] for row in rows]
            assert ys == pytest.approx([_finite(row[col]) for row in rows], nan_ok=False)

    # The export buttons hand over the run as a step log, as CSV, and the chart as PNG.
    files = {}
    for button in ("#btn-jsonl", "#btn-csv", "#btn-png"):
        async with page.expect_download() as info:
            await page.locator(button).click()
        dl = await info.value
        files[button] = Path(await dl.path())
    exported = read_log(files["#btn-jsonl"])
    assert [r.step for r in exported.records if r.type == "step"] == [s.step for s in a + b]
    csv_lines = files["#btn-csv"].read_text().splitlines()
    assert "step" in csv_lines[0] and len(csv_lines) == 1 + 180
    assert files["#btn-png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert page.errors == []


def _finite(v: Any) -> float | None:
    return v if isinstance(v, (int, float)) and math.isfinite(v) else None


async def test_freeze_holds_live_steps_unfreeze_draws_them_and_log_scale_applies(
        server: ServerProc, page: Page) -> None:
    run = "pausing"
    sent = steps(90)
    async with websockets.connect(f"{server.ws}/ws/ingest") as ws:
        await ws.send(IngestBatch(run=run, records=[header(run, "pausing"), optimizer(),
                                                    *sent[:30]]).model_dump_json())
        await page.goto(f"{server.http}/?run={run}")
        await wait_for(lambda: _count_is(page, 30))
        await page.locator("#btn-freeze").click()
        await ws.send(IngestBatch(run=run, records=sent[30:90]).model_dump_json())
        # The facts line shows the steps arriving, but the frozen chart does not move.
        await wait_for(lambda: _text_has(page, "#run-facts", "90"))
        await page.wait_for_timeout(300)
        assert await plotted_steps(page) == 30
        await page.locator("#btn-freeze").click()
        await wait_for(lambda: _count_is(page, 90))
        xs, ys = (await plotted(page, "norm"))["SGD#0"]
        assert xs == list(range(90)) and ys == pytest.approx([s.norm for s in sent])

        await page.locator("#chk-log").check()
        await wait_for(lambda: page.evaluate(
            "document.getElementById('chart')._fullLayout.yaxis.type === 'log'"))
    # The stream closed without an End record: once the server calls the run interrupted,
    # it is a stored run, and the step player opens.
    await page.locator("#slider:enabled").wait_for(timeout=20_000)
    await page.locator("#slider").fill("45")
    assert "step 45" in await page.locator("#readout").text_content()
    assert page.errors == []


async def _text_has(page: Page, selector: str, *parts: str) -> bool:
    text = await page.locator(selector).text_content() or ""
    return all(p in text for p in parts)


async def test_a_long_run_is_downsampled_and_zooming_refetches_full_detail(
        server: ServerProc, page: Page) -> None:
    n, missed = 20_000, (12_000, 12_050)
    sent = steps(n, missed=missed)
    await ingest(server.ws, "long", [header("long", "long run"), optimizer(), *sent,
                                     End(seq=sent[-1].seq + 1, t=1_700_001_000.0, steps=n)],
                 batch=1000)
    await page.goto(f"{server.http}/?run=long")
    await page.wait_for_function("document.body.dataset.snapshot >= 1")
    xs, ys = (await plotted(page, "norm"))["SGD#0"]
    assert 100 < len(xs) < n / 4  # downsampled server-side...
    # ...keeping the spike of the missed reset (min/max per bucket).
    assert max(ys) == pytest.approx(max(s.norm for s in sent if s.norm is not None))
    assert "of 20,000 rows" in await page.locator("#sampling").text_content()

    await page.locator(".finding[data-kind='missed_reset']").click()
    # The zoom re-fetches the window from the server: every step of it, no sampling.
    xs = await wait_for(lambda: _zoomed_steps(page))
    assert xs == list(range(xs[0], xs[-1] + 1))
    assert xs[0] <= missed[0] and xs[-1] >= missed[1] - 1 and len(xs) < 200
    _, ys = (await plotted(page, "norm"))["SGD#0"]
    assert ys == pytest.approx([s.norm for s in sent[xs[0]:xs[-1] + 1]])
    # It lands on the finding's first step (the first to re-apply old gradients): the
    # cursor is there and the readout gives that step's own values.
    first = missed[0] + 1
    s = sent[first]
    want = (f"step {first:,} ", f"‖grad‖ {s.norm:.3g} fresh {s.fresh_norm:.3g} "
            f"drift {s.drift:.3g} stale {s.stale}")
    await wait_for(lambda: _text_has(page, "#readout", *want))
    cursor = await page.evaluate("""document.getElementById('chart').layout.shapes
      .filter(s => s.type === 'line' && s.xref === 'x').map(s => s.x0)""")
    assert cursor == [first]
    assert page.errors == []


async def _zoomed_steps(page: Page) -> list[int] | None:
    traces = await plotted(page, "norm")
    xs = traces["SGD#0"][0] if "SGD#0" in traces else []
    return xs if xs and len(xs) < 1000 else None
