"""Websocket routes: ``/ws/ingest`` (probes, replay) and ``/ws/live`` (dashboards).

Thin: they check the handshake, then hand an ingest connection to
:class:`server.ws_ingest.IngestSession` or pump a live client's queue
(:mod:`server.fanout`). Close codes are :mod:`server.ws_close`'s (see API.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys

from fastapi import APIRouter, Query, WebSocket, WebSocketDisconnect

from gradwatch.frames import RunsFrame, SnapshotFrame, frame_json
from gradwatch.server import ws_close
from gradwatch.server.fanout import Client
from gradwatch.server.runs import Runs
from gradwatch.server.security import origin_ok, token_ok
from gradwatch.server.ws_ingest import IngestSession

log = logging.getLogger(__name__)
router = APIRouter()


async def _guard(ws: WebSocket) -> Runs | None:
    """Refuse a handshake with a foreign Origin or without the token (→ HTTP 403)."""
    runs: Runs = ws.app.state.runs
    if not origin_ok(runs.settings, ws.headers):
        log.warning("refused websocket %s from foreign origin %r", ws.url.path,
                    ws.headers.get("origin"))
        await ws.close(ws_close.POLICY, "origin not allowed")
        return None
    if not token_ok(runs.settings, ws.headers, ws.query_params):
        await ws.close(ws_close.POLICY, "this server requires a token")
        return None
    return runs


@router.websocket("/ws/ingest")
async def ingest(ws: WebSocket) -> None:
    """Receive IngestBatch frames; ack each stored batch (see API.md)."""
    runs = await _guard(ws)
    if runs is None:
        return
    await ws.accept()
    await IngestSession(ws, runs).run()


@router.websocket("/ws/live")
async def live(ws: WebSocket, run: str | None = None,
               max_points: int = Query(4000, ge=10, le=100_000)) -> None:
    """Run list (no ``run``) or one run's snapshot then live frames (see API.md)."""
    runs = await _guard(ws)
    if runs is None:
        return
    await ws.accept()
    client = runs.hub.subscribe(run)
    if client is None:
        await ws.close(ws_close.TRY_LATER, "too many live clients; retry later")
        return
    try:
        if run is None:
            every = await asyncio.to_thread(runs.reader.runs)
            await ws.send_text(RunsFrame(runs=every).model_dump_json())
        else:
            snap = await asyncio.to_thread(_snapshot, runs, run, max_points)
            if snap is None:
                await ws.close(ws_close.NO_RUN, ws_close.short(f"no run '{run}'"))
                return
            client.skip_until, text = snap
            await ws.send_text(text)
        await _pump(ws, client, runs.settings.send_timeout)
    finally:
        runs.hub.unsubscribe(client)


def _snapshot(runs: Runs, run: str, max_points: int
              ) -> tuple[dict[tuple[int, str], int], str] | None:
    """The snapshot frame's text, and per (rank, opt) the last step it holds."""
    summary = runs.reader.summary(run)
    if summary is None:
        return None
    last: dict[tuple[int, str], int] = {}
    steps = runs.reader.steps(run, max_points=max_points, last=last)
    findings = runs.reader.findings(run) or []
    if steps is None:
        return None
    return last, frame_json(SnapshotFrame, run=summary, optimizers=runs.reader.optimizers(run),
                            steps=steps.columns(), findings=findings)


async def _send(ws: WebSocket, text: str, timeout: float) -> None:
    if sys.version_info >= (3, 11):  # a timer, not a task per frame as wait_for makes
        async with asyncio.timeout(timeout):
            await ws.send_text(text)
    else:  # pragma: no cover - Python 3.10
        await asyncio.wait_for(ws.send_text(text), timeout)


async def _pump(ws: WebSocket, client: Client, send_timeout: float) -> None:
    """Send queued frames until the client leaves or blocks longer than send_timeout."""

    async def drain_incoming() -> None:
        while True:
            msg = await ws.receive()
            if msg["type"] == "websocket.disconnect":
                return

    async def send_frames() -> None:
        while True:
            for text in await client.next():
                try:
                    await _send(ws, text, send_timeout)
                except asyncio.TimeoutError:
                    log.warning("live client too slow (blocked %.0fs); dropping it",
                                send_timeout)
                    with contextlib.suppress(Exception):
                        await ws.close(ws_close.TRY_LATER, "too slow: dropped")
                    return

    tasks = {asyncio.create_task(drain_incoming()), asyncio.create_task(send_frames())}
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, WebSocketDisconnect,
                                     RuntimeError):
                await t
