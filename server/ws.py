"""Websocket routes: ``/ws/ingest`` (probes, replay) and ``/ws/live`` (dashboards).

Thin: :class:`server.security.Guard` has checked the handshake (Host, Origin, token); they
admit an ingest connection (:class:`server.limits.IngestGate`) and hand it to
:class:`server.ws_ingest.IngestSession`, or pump a live client's queue
(:mod:`server.fanout`) with a deadline on every send. Close codes are the contract's
(:class:`gradwatch.frames.CloseCode`), picked per refusal by :mod:`server.ws_close`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from fastapi import APIRouter, Query, WebSocket, WebSocketDisconnect
from fastapi.exceptions import WebSocketRequestValidationError

from gradwatch.frames import CloseCode, RunsFrame, SnapshotFrame, frame_json
from gradwatch.server import ws_close
from gradwatch.server.api import validation_sentence
from gradwatch.server.errors import Refused
from gradwatch.server.fanout import Client
from gradwatch.server.limits import within
from gradwatch.server.modelnorms import Norms, model_steps
from gradwatch.server.runs import Runs
from gradwatch.server.ws_ingest import IngestSession

log = logging.getLogger(__name__)
router = APIRouter()


async def invalid_handshake(ws: WebSocket, exc: Exception) -> None:
    """A websocket whose query FastAPI could not validate (``/ws/live?max_points=abc``):
    accepted, then closed 1007 with a reason naming the field (FastAPI's own answer refuses
    the handshake, which a client sees as a bare 403)."""
    assert isinstance(exc, WebSocketRequestValidationError)
    await ws.accept()
    await ws.close(CloseCode.INVALID, ws_close.short(validation_sentence(exc.errors())))


@router.websocket("/ws/ingest")
async def ingest(ws: WebSocket) -> None:
    """Receive IngestBatch frames; ack each stored batch (see API.md).

    Host, Origin and token were checked by :class:`server.security.Guard`.
    """
    runs: Runs = ws.app.state.runs
    address = ws.client.host if ws.client else "unknown"
    await ws.accept()
    try:
        limiter, trial = runs.gate.open(address)
    except Refused as e:
        await ws.close(ws_close.close_code(e), ws_close.short(e.reason))
        return
    session = IngestSession(ws, runs, limiter, trial)
    try:
        await session.run()
    finally:
        runs.gate.close(address, session.trial)


@router.websocket("/ws/live")
async def live(ws: WebSocket, run: str | None = None,
               max_points: int = Query(4000, ge=10, le=100_000),
               norms: Norms = "model") -> None:
    """Run list (no ``run``) or one run's snapshot then live frames (see API.md); a
    sharded optimizer's norms are the model's (``norms=model``) or each rank's own."""
    runs: Runs = ws.app.state.runs
    await ws.accept()
    client = runs.hub.subscribe(run, norms)
    if client is None:
        await ws.close(CloseCode.TRY_LATER, "too many live clients; retry later")
        return
    timeout = runs.settings.send_timeout
    try:
        if run is None:
            every = await asyncio.to_thread(runs.reader.runs)
            first = RunsFrame(runs=every).model_dump_json()
        else:
            snap = await asyncio.to_thread(_snapshot, runs, run, max_points, norms)
            if snap is None:
                await ws.close(CloseCode.NO_RUN, ws_close.short(f"no run '{run}'"))
                return
            client.skip_until, first = snap
        # The first frame has the same deadline as every other: a client that never
        # reads must not hold a live slot.
        if await _send(ws, first, timeout):
            await _pump(ws, client, timeout)
    finally:
        runs.hub.unsubscribe(client)


def _snapshot(runs: Runs, run: str, max_points: int, norms: Norms
              ) -> tuple[dict[tuple[int, str], int], str] | None:
    """The snapshot frame's text, and per (rank, opt) the last step it holds."""
    summary = runs.reader.summary(run)
    if summary is None:
        return None
    last: dict[tuple[int, str], int] = {}
    steps = (model_steps(runs.reader, run, max_points=max_points, last=last)
             if norms == "model" else runs.reader.steps(run, max_points=max_points, last=last))
    findings = runs.reader.findings(run) or []
    if steps is None:
        return None
    return last, frame_json(SnapshotFrame, run=summary, optimizers=runs.reader.optimizers(run),
                            steps=steps.columns(), findings=findings)


async def _send(ws: WebSocket, text: str, timeout: float) -> bool:
    """Send a frame within ``timeout`` seconds; else close the socket (1013), False."""
    try:
        await within(ws.send_text(text), timeout)
        return True
    except asyncio.TimeoutError:
        log.warning("live client too slow (blocked %.0fs); dropping it", timeout)
        await _close(ws, "too slow: dropped")
        return False


async def _close(ws: WebSocket, reason: str) -> None:
    # A close frame waits behind the frames a stuck client never read: give up on it
    # after a moment (the transport is aborted; see server.transport).
    with contextlib.suppress(Exception):
        await within(ws.close(CloseCode.TRY_LATER, reason), 1.0)


async def _pump(ws: WebSocket, client: Client, send_timeout: float) -> None:
    """Send queued frames until the client leaves or blocks longer than send_timeout."""

    async def drain_incoming() -> None:
        while True:
            msg = await ws.receive()
            if msg["type"] == "websocket.disconnect":
                return

    async def send_frames() -> None:
        while True:
            texts = await client.next()
            if client.too_slow is not None:
                log.warning("live client %s; dropping it", client.too_slow)
                await _close(ws, ws_close.short(client.too_slow))
                return
            for text in texts:
                if not await _send(ws, text, send_timeout):
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
