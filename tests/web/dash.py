"""Helpers for the dashboard tests: read what the charts plot, and feed the server.

``plotted`` reads the points straight from the plotly graph div (``gd.data``), so a test
checks what the user sees, not what the page meant to draw. ``ingest`` speaks the real
wire protocol (``IngestBatch`` frames of :mod:`gradwatch.wire` records on ``/ws/ingest``)
for tests that need exact, deterministic rows.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import websockets

from gradwatch.wire import End, Header, IngestBatch, OptimizerInfo, Reset, Site, Step, StepSites

READ_TRACES = """([chart, field]) => Array.from(document.getElementById(chart).data || [])
  .filter(t => t.meta && t.meta.field === field)
  .map(t => ({run: t.meta.run, opt: t.meta.opt, rank: t.meta.rank, name: t.name,
              x: Array.from(t.x), y: Array.from(t.y)}))"""


async def plotted(page: Any, field: str = "norm") -> dict[str, tuple[list[int], list[Any]]]:
    """``{opt: (steps, values)}`` of the main chart's traces of one field."""
    traces = await page.evaluate(READ_TRACES, ["chart", field])
    return {t["opt"]: (t["x"], t["y"]) for t in traces}


async def compared(page: Any, field: str = "norm") -> dict[str, tuple[list[int], list[Any]]]:
    """``{run id: (steps, values)}`` of the compare chart's traces of one field."""
    traces = await page.evaluate(READ_TRACES, ["compare-chart", field])
    return {t["run"]: (t["x"], t["y"]) for t in traces}


async def plotted_steps(page: Any) -> int:
    """Number of step points on the main chart's norm traces."""
    return sum(len(x) for x, _ in (await plotted(page)).values())


def header(run: str, name: str, t: float = 1_700_000_000.0) -> Header:
    return Header(seq=0, t=t, run=run, run_name=name, torch_version="2.13.0",
                  gradwatch_version="0.1.0", started=t)


FILE = "/home/user/project/train.py"
BACKWARD_SITE, STEP_SITE, RESET_SITE = 1, 2, 3
LINES = {BACKWARD_SITE: 40, STEP_SITE: 42, RESET_SITE: 44}
"""The lines of the user's loop the ``sites`` records name: ``loss.backward()`` at
train.py:40, ``opt.step()`` at :42 and ``opt.zero_grad()`` at :44."""


def sites(first_seq: int = 2, t: float = 1_700_000_000.0) -> list[Site]:
    """Site records of the three calls, for ``steps(..., where=True)``."""
    return [Site(seq=first_seq + k, t=t, id=sid, file=FILE, line=LINES[sid], function="main")
            for k, sid in enumerate((BACKWARD_SITE, STEP_SITE, RESET_SITE))]


def steps(n: int, *, first_seq: int = 2, first_step: int = 0, opt: str = "SGD#0",
          missed: tuple[int, int] | None = None, late: tuple[int, int] | None = None,
          where: bool = False, t0: float = 1_700_000_000.0) -> list[Step]:
    """``n`` step records of a 2-parameter optimizer; a missed reset in [a, b) if given, a
    late reset (between backward and step) in ``late``; ``where``: they name the lines of
    :func:`sites`.

    Norms follow a slow, obvious formula so a test can recompute them.
    """
    out = []
    acc = 0.0
    for i in range(first_step, first_step + n):
        fresh = 1.0 + 0.25 * math.sin(i / 5.0)
        bug = missed is not None and missed[0] <= i < missed[1]
        wiped = late is not None and late[0] <= i < late[1]
        acc = acc + fresh if bug else 0.0 if wiped else fresh
        reset = Reset(how="optimizer_zero_grad", params=[0, 1], after_backward=wiped,
                      site=RESET_SITE if where and wiped else None)
        stale = 2 * (i - missed[0]) if bug and missed else 0
        at = None
        if where and stale:
            at = StepSites(step=STEP_SITE, stale=[BACKWARD_SITE])
        elif where and wiped:
            at = StepSites(step=STEP_SITE, lost=[BACKWARD_SITE])
        out.append(Step(
            seq=first_seq + i - first_step, t=t0 + i * 0.01, opt=opt, step=i, backwards=1,
            consumed=2 * (1 + (i - missed[0] if bug and missed else 0)), fresh=2,
            stale=stale, stale_params=[0, 1] if stale else [],
            late_params=[0, 1] if wiped else [],
            resets=[] if bug else [reset], norm=acc, fresh_norm=fresh, drift=acc / fresh,
            param_norms=[acc * 0.8, acc * 0.6], param_fresh_norms=[fresh * 0.8, fresh * 0.6],
            sites=at))
    return out


def optimizer(opt: str = "SGD#0", label: str | None = None) -> OptimizerInfo:
    """``label``: what the run's code calls it (``d_opt``), as the probe finds it."""
    return OptimizerInfo(seq=1, t=1_700_000_000.0, opt=opt, cls="SGD",
                         params=["layer.weight", "layer.bias"], shapes=[[4, 4], [4]],
                         groups=[0, 0], label=label)


def finished(run: str, name: str, sent: list[Step], opt: str = "SGD#0",
             before: list[Any] | None = None) -> list[Any]:
    """A whole stream: header, optimizer, ``before`` (site records), the steps and End."""
    info = optimizer(opt)
    return [header(run, name), info, *(before or []), *sent,
            End(seq=sent[-1].seq + 1, t=sent[-1].t + 1, steps=len(sent))]


async def ingest(ws_base: str, run: str, records: list[Any], rank: int = 0,
                 batch: int = 500, token: str | None = None) -> None:
    """Send records as IngestBatch frames and wait until the server acked the last one."""
    last = records[-1].seq
    url = f"{ws_base}/ws/ingest" + (f"?token={token}" if token else "")
    async with websockets.connect(url, max_size=None) as ws:
        for i in range(0, len(records), batch):
            frame = IngestBatch(run=run, rank=rank, records=records[i:i + batch])
            await ws.send(frame.model_dump_json())
        while True:
            msg = json.loads(await ws.recv())
            if msg.get("type") == "ack" and msg.get("seq", -1) >= last:
                return


async def wait_for(pred, timeout: float = 15.0, every: float = 0.1):  # type: ignore[no-untyped-def]
    """Poll an async predicate until it returns something truthy."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        got = await pred()
        if got:
            return got
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {timeout} s (last value {got!r})")
        await asyncio.sleep(every)


async def in_view(page: Any, selector: str) -> list[dict[str, float]]:
    """Bounding boxes of every element matching ``selector`` that lies wholly inside the
    viewport, without scrolling; raises naming the first one that does not."""
    boxes = await page.evaluate("""sel => Array.from(document.querySelectorAll(sel))
      .map(e => { const r = e.getBoundingClientRect();
                  return {x: r.x, y: r.y, w: r.width, h: r.height}; })""", selector)
    size = page.viewport_size
    assert boxes, f"nothing matches {selector}"
    for b in boxes:
        inside = (b["w"] > 0 and b["h"] > 0 and b["x"] >= 0 and b["y"] >= 0
                  and b["x"] + b["w"] <= size["width"] and b["y"] + b["h"] <= size["height"])
        assert inside, f"{selector} at {b} is not inside the {size} viewport"
    return boxes
