"""Dashboard benchmark: time to first chart for stored runs, frame times while live.

Prints figures (not a pass/fail test):

* time from navigation to a drawn chart for stored runs of 10,000 and 1,000,000 steps
  (target: at most 1.5 s at 1,000,000 steps);
* the median and p95 frame time (interval between animation frames) while a run streams
  1,000 steps/s into the open page (target: p95 at most 50 ms).

It starts ``gradwatch serve`` on a free loopback port, feeds it with real ``IngestBatch``
frames on ``/ws/ingest`` and drives Debian's Chromium with Playwright. Pass ``--data DIR``
to keep the stored runs between invocations (ingesting 1,000,000 steps is the slow part).

    python bench/dashboard.py [--data DIR] [--live-seconds 10] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import websockets

from gradwatch.wire import End, Header, IngestBatch, OptimizerInfo, Reset, Step

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.serverproc import ServerProc  # noqa: E402

CHROMIUM = os.environ.get("GRADWATCH_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
]
T0 = 1_700_000_000.0
VIEWPORT = {"width": 1400, "height": 900}
BATCH = 2000  # records per ingest frame: well under the server's 1 MiB frame limit


def run_exists(port: int, run: str, steps: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/runs/{run}", timeout=5) as r:
            return int(json.load(r).get("steps", 0)) >= steps
    except OSError:
        return False


def step_record(i: int, seq: int, missed: tuple[int, int], acc: float) -> tuple[Step, float]:
    """One step of a 2-parameter optimizer; a forgotten zero_grad in [missed)."""
    fresh = 1.0 + 0.25 * math.sin(i / 50.0)
    bug = missed[0] <= i < missed[1]
    acc = acc + fresh if bug else fresh
    return Step(
        seq=seq, t=T0 + i * 0.001, opt="AdamW#0", step=i, backwards=1, consumed=2, fresh=2,
        stale=2 if bug and i > missed[0] else 0,
        resets=[] if bug else [Reset(how="optimizer_zero_grad", params=[0, 1])],
        norm=acc, fresh_norm=fresh, drift=acc / fresh,
        param_norms=[acc * 0.8, acc * 0.6], param_fresh_norms=[fresh * 0.8, fresh * 0.6],
    ), acc


def head_records(run: str) -> list[Any]:
    return [
        Header(seq=0, t=T0, run=run, run_name=run, torch_version="2.13.0",
               gradwatch_version="0.1.0", started=T0),
        OptimizerInfo(seq=1, t=T0, opt="AdamW#0", cls="AdamW",
                      params=["encoder.weight", "encoder.bias"], shapes=[[512, 512], [512]],
                      groups=[0, 0]),
    ]


# Step fields left at their defaults here; leaving them out keeps frames under 1 MiB.
_DEFAULTS = {"stale_params", "leaked_params", "late_params", "discarded_params",
             "closure_evals", "skipped"}


async def send(ws: Any, run: str, records: list[Any]) -> None:
    frame = IngestBatch(run=run, records=records)
    await ws.send(frame.model_dump_json(exclude={"records": {"__all__": _DEFAULTS}}))


async def wait_ack(ws: Any, seq: int) -> None:
    while True:
        msg = json.loads(await ws.recv())
        if msg.get("type") == "ack" and msg.get("seq", -1) >= seq:
            return


async def ingest_stored(ws_base: str, run: str, n: int) -> float:
    """Stream a finished run of n steps into the server; returns seconds taken."""
    t = time.perf_counter()
    missed = (n // 3, n // 3 + max(10, n // 50))
    async with websockets.connect(f"{ws_base}/ws/ingest", max_size=None) as ws:
        batch: list[Any] = head_records(run)
        acc = 0.0
        seq = 2
        for i in range(n):
            rec, acc = step_record(i, seq, missed, acc)
            batch.append(rec)
            seq += 1
            if len(batch) >= BATCH:
                await send(ws, run, batch)
                batch = []
                if i % (BATCH * 50) < BATCH:  # keep at most ~50 frames in flight
                    await wait_ack(ws, seq - 1)
        batch.append(End(seq=seq, t=T0 + n * 0.001, steps=n))
        await send(ws, run, batch)
        await wait_ack(ws, seq)
    return time.perf_counter() - t


FIRST_CHART = """() => new Promise(resolve => {
  const done = () => {
    const gd = document.getElementById('chart');
    const pts = gd && gd.data ? gd.data.filter(t => t.meta && t.meta.field === 'norm')
      .reduce((a, t) => a + t.x.length, 0) : 0;
    const first = performance.getEntriesByName('gradwatch:first-chart');
    const plotly = performance.getEntriesByName('gradwatch:plotly-chart');
    if (first.length && plotly.length && pts > 0) {
      resolve({first: first[0].startTime, plotly: plotly[0].startTime, points: pts});
    } else {
      setTimeout(done, 10);
    }
  };
  done();
})"""

FRAME_PROBE = """() => {
  window.__frames = [];
  let last = performance.now();
  const tick = (now) => {
    window.__frames.push(now - last);
    last = now;
    requestAnimationFrame(tick);
  };
  requestAnimationFrame(tick);
}"""


async def time_to_chart(pw: Any, browser: Any, url: str, repeat: int, warm: bool = False
                        ) -> list[dict[str, Any]]:
    """Per page load: ms from navigation to the first drawn chart (the canvas preview or
    the plotly figure, whichever came first) and to the interactive plotly figure.

    Cold: each load in a new browser context (a first visit: empty HTTP and code caches).
    Warm: loads in one persistent browser profile after two visits (a returning user:
    plotly.js comes from the HTTP cache and V8's code cache). Chromium keeps no code cache
    for Playwright's incognito contexts, so only a profile on disk shows what a returning
    user gets.
    """
    out = []

    async def load(ctx: Any) -> dict[str, Any]:
        page = await ctx.new_page()
        await page.goto(url, wait_until="commit")
        res = await asyncio.wait_for(page.evaluate(FIRST_CHART), 60)
        await page.close()
        return dict(res)

    if not warm:
        for _ in range(repeat):
            ctx = await browser.new_context(viewport=VIEWPORT)
            out.append(await load(ctx))
            await ctx.close()
        return out
    profile = tempfile.mkdtemp(prefix="gw-bench-profile-")
    ctx = await pw.chromium.launch_persistent_context(
        profile, executable_path=CHROMIUM, args=CHROMIUM_ARGS, viewport=VIEWPORT)
    try:
        for i in range(repeat + 2):
            res = await load(ctx)
            if i >= 2:
                out.append(res)
            await asyncio.sleep(0.5)  # the code cache is written after the load
    finally:
        await ctx.close()
        shutil.rmtree(profile, ignore_errors=True)
    return out


PLOTLY_ALONE = """(src) => new Promise((resolve, reject) => {
  const t0 = performance.now();
  const s = document.createElement("script");
  s.src = src;
  s.onload = () => resolve(performance.now() - t0);
  s.onerror = () => reject(new Error("could not load " + src));
  document.head.append(s);
})"""


async def plotly_alone(browser: Any, base: str, repeat: int) -> list[float]:
    """ms to download and evaluate plotly.js on a blank page: the floor under the
    interactive chart's time, whatever the dashboard does."""
    out = []
    for _ in range(repeat):
        ctx = await browser.new_context()
        page = await ctx.new_page()
        await page.goto(f"{base}/healthz")  # same origin, no dashboard code
        out.append(await page.evaluate(PLOTLY_ALONE, f"{base}/static/vendor/plotly.min.js"))
        await ctx.close()
    return out


async def live_frames(browser: Any, base: str, ws_base: str, seconds: float,
                      rate: int) -> dict[str, Any]:
    run = f"bench-live-{int(time.time())}"
    async with websockets.connect(f"{ws_base}/ws/ingest", max_size=None) as ws:
        await send(ws, run, head_records(run))
        await wait_ack(ws, 1)
        ctx = await browser.new_context(viewport=VIEWPORT)
        page = await ctx.new_page()
        await page.goto(f"{base}/?run={run}")
        await page.wait_for_function("document.body.dataset.snapshot >= 1", timeout=30_000)
        tick = 0.02  # 50 frames/s of 20 steps each = 1,000 steps/s
        per = int(rate * tick)
        seq, i, acc = 2, 0, 0.0
        missed = (int(rate * seconds * 0.4), int(rate * seconds * 0.6))
        start = time.perf_counter()
        warm = start + 1.0
        probing = False
        while (now := time.perf_counter()) - start < seconds + 1.0:
            if not probing and now >= warm:
                await page.evaluate(FRAME_PROBE)
                probing = True
            batch = []
            for _ in range(per):
                rec, acc = step_record(i, seq, missed, acc)
                batch.append(rec)
                seq += 1
                i += 1
            await send(ws, run, batch)
            target = start + (i / rate)
            await asyncio.sleep(max(0.0, target - time.perf_counter()))
        elapsed = time.perf_counter() - start
        frames = await page.evaluate("window.__frames.slice(1)")
        await send(ws, run, [End(seq=seq, t=T0 + i * 0.001, steps=i)])
        await asyncio.sleep(0.5)
        plotted = await page.evaluate(
            "document.getElementById('chart').data.filter(t => t.meta && "
            "t.meta.field === 'norm').reduce((a, t) => a + t.x.length, 0)")
        await ctx.close()
    frames.sort()
    return {
        "steps": i, "rate": i / elapsed, "frames": len(frames),
        "median": statistics.median(frames) if frames else float("nan"),
        "p95": frames[int(0.95 * (len(frames) - 1))] if frames else float("nan"),
        "max": frames[-1] if frames else float("nan"), "plotted": plotted,
    }


async def main_async(args: argparse.Namespace) -> int:
    from playwright.async_api import async_playwright

    data = Path(args.data) if args.data else Path(tempfile.mkdtemp(prefix="gw-bench-"))
    data.mkdir(parents=True, exist_ok=True)
    srv = ServerProc(data / "server").start()  # its log lands in data/
    port, base, ws_base = srv.port, srv.http, srv.ws
    try:
        for run, n in (("bench-10k", 10_000), ("bench-1m", 1_000_000)):
            if run_exists(port, run, n):
                print(f"stored run {run}: already in {data}")
                continue
            secs = await asyncio.wait_for(ingest_stored(ws_base, run, n), args.ingest_timeout)
            print(f"stored run {run}: ingested {n:,} steps in {secs:.1f} s")
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            alone = await plotly_alone(browser, base, args.repeat)
            print(f"plotly.js alone on a blank page (first visit): "
                  f"{statistics.median(alone):.0f} ms (median of "
                  f"{', '.join(f'{m:.0f}' for m in alone)})")
            for (run, n), warm in itertools.product(
                    (("bench-10k", 10_000), ("bench-1m", 1_000_000)), (False, True)):
                res = await time_to_chart(pw, browser, f"{base}/?run={run}", args.repeat, warm)
                first = [r["first"] for r in res]
                inter = [r["plotly"] for r in res]
                visit = "returning visit" if warm else "first visit"
                print(f"stored run of {n:,} steps, {visit}: first chart drawn "
                      f"{statistics.median(first):.0f} ms after navigation (median of "
                      f"{', '.join(f'{m:.0f}' for m in first)}); interactive plotly chart "
                      f"{statistics.median(inter):.0f} ms (median of "
                      f"{', '.join(f'{m:.0f}' for m in inter)}); "
                      f"{res[0]['points']:,} points plotted")
            live = await asyncio.wait_for(
                live_frames(browser, base, ws_base, args.live_seconds, 1000),
                args.live_seconds + 60)
            print(f"live at {live['rate']:.0f} steps/s for {live['steps']:,} steps: frame time "
                  f"median {live['median']:.1f} ms, p95 {live['p95']:.1f} ms, "
                  f"max {live['max']:.1f} ms over {live['frames']} frames "
                  f"({live['plotted']:,} points on the chart at the end)")
            await browser.close()
    finally:
        srv.stop()
        if not args.data:  # a temporary store of ~1 GB: do not leave it behind
            shutil.rmtree(data, ignore_errors=True)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", help="server data dir to keep stored runs between invocations")
    p.add_argument("--live-seconds", type=float, default=10.0)
    p.add_argument("--repeat", type=int, default=3, help="page loads per stored run")
    p.add_argument("--ingest-timeout", type=float, default=600.0)
    args = p.parse_args()
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
