"""Helpers for the dashboard tests: read what the charts plot, and feed the server.

``plotted`` reads the points straight from the plotly graph div (``gd.data``), so a test
checks what the user sees, not what the page meant to draw. ``ingest`` speaks the real
wire protocol (``IngestBatch`` frames of :mod:`gradwatch.wire` records on ``/ws/ingest``)
for tests that need exact, deterministic rows.
"""

from __future__ import annotations

import json
import math
from typing import Any

import websockets

from gradwatch.wire import Header, IngestBatch, OptimizerInfo, Reset, Step

READ_TRACES = """field => Array.from(document.getElementById('chart').data || [])
  .filter(t => t.meta && t.meta.field === field)
  .map(t => ({opt: t.meta.opt, rank: t.meta.rank, x: Array.from(t.x), y: Array.from(t.y)}))"""


async def plotted(page: Any, field: str = "norm") -> dict[str, tuple[list[int], list[Any]]]:
    """``{opt: (steps, values)}`` of the main chart's traces of one field."""
    traces = await page.evaluate(READ_TRACES, field)
    return {t["opt"]: (t["x"], t["y"]) for t in traces}


async def plotted_steps(page: Any) -> int:
    """Number of step points on the main chart's norm traces."""
    return sum(len(x) for x, _ in (await plotted(page)).values())


def header(run: str, name: str, t: float = 1_700_000_000.0) -> Header:
    return Header(seq=0, t=t, run=run, run_name=name, torch_version="2.13.0",
                  gradwatch_version="0.1.0", started=t)


def steps(n: int, *, first_seq: int = 2, first_step: int = 0, opt: str = "SGD#0",
          missed: tuple[int, int] | None = None, t0: float = 1_700_000_000.0) -> list[Step]:
    """``n`` step records of a 2-parameter optimizer; a missed reset in [a, b) if given.

    Norms follow a slow, obvious formula so a test can recompute them.
    """
    out = []
    acc = 0.0
    for i in range(first_step, first_step + n):
        fresh = 1.0 + 0.25 * math.sin(i / 5.0)
        bug = missed is not None and missed[0] <= i < missed[1]
        acc = acc + fresh if bug else fresh
        resets = [] if bug else [Reset(how="optimizer_zero_grad", params=[0, 1])]
        out.append(Step(
            seq=first_seq + i - first_step, t=t0 + i * 0.01, opt=opt, step=i, backwards=1,
            consumed=2 * (1 + (i - missed[0] if bug and missed else 0)), fresh=2,
            stale=2 * (i - missed[0]) if bug and missed else 0,
            stale_params=[0, 1] if bug and missed and i > missed[0] else [],
            resets=resets, norm=acc, fresh_norm=fresh, drift=acc / fresh,
            param_norms=[acc * 0.8, acc * 0.6], param_fresh_norms=[fresh * 0.8, fresh * 0.6]))
    return out


def optimizer(opt: str = "SGD#0") -> OptimizerInfo:
    return OptimizerInfo(seq=1, t=1_700_000_000.0, opt=opt, cls="SGD",
                         params=["layer.weight", "layer.bias"], shapes=[[4, 4], [4]],
                         groups=[0, 0])


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
