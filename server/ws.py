"""Websocket routes: ``/ws/ingest`` (probes, replay) and ``/ws/live`` (dashboards).

Thin: they check the handshake, then hand frames to :mod:`server.ingest` and
:class:`server.service.Service`, and turn errors into close codes (see API.md).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
import logging
import sys
from typing import Any

from fastapi import APIRouter, Query, WebSocket, WebSocketDisconnect

from gradwatch.frames import Ack, Hello, Resume, RunsFrame, SnapshotFrame
from gradwatch.server.fanout import Client
from gradwatch.server.ingest import (
    CLOSE_NO_RUN,
    CLOSE_POLICY,
    CLOSE_TRY_LATER,
    CLOSE_UNSUPPORTED,
    FrameError,
    RateLimiter,
    check_size,
    short,
)
from gradwatch.server.security import origin_ok, token_ok
from gradwatch.server.service import Service
from gradwatch.server.storage import IngestError, StoreBusy

log = logging.getLogger(__name__)
router = APIRouter()


async def _guard(ws: WebSocket) -> Service | None:
    """Refuse a handshake with a foreign Origin or without the token (→ HTTP 403)."""
    svc: Service = ws.app.state.service
    if not origin_ok(svc.settings, ws.headers):
        log.warning("refused websocket %s from foreign origin %r", ws.url.path,
                    ws.headers.get("origin"))
        await ws.close(CLOSE_POLICY, "origin not allowed")
        return None
    if not token_ok(svc.settings, ws.headers, ws.query_params):
        await ws.close(CLOSE_POLICY, "this server requires a token")
        return None
    return svc


@router.websocket("/ws/ingest")
async def ingest(ws: WebSocket) -> None:
    """Receive IngestBatch frames; ack each stored batch (see API.md)."""
    svc = await _guard(ws)
    if svc is None:
        return
    await ws.accept()
    await _IngestSession(ws, svc).run()


class _IngestSession:
    """One ingest connection, pipelined: frame k+1 is read and validated while frame k is
    being stored; acks go out in order. The first bad frame closes the connection after
    the valid frames before it are stored and acked."""

    PIPELINE = 4

    def __init__(self, ws: WebSocket, svc: Service):
        self.ws, self.svc = ws, svc
        self.limiter = RateLimiter(svc.settings.max_msgs_per_sec)
        self.pending: asyncio.Queue[tuple[Any, Any] | None] = asyncio.Queue(self.PIPELINE)
        self.runs: set[str] = set()

    async def run(self) -> None:
        acker = asyncio.create_task(self._acks())
        receiver = asyncio.create_task(self._receive())
        try:
            await asyncio.wait({acker, receiver}, return_when=asyncio.FIRST_COMPLETED)
            if not receiver.done():  # the acker stopped on a refused batch
                receiver.cancel()
            err = await _quiet(receiver)
            if err is not None or not acker.done():
                await self.pending.put(None)  # let the valid frames before it finish
            refused = await _quiet(acker)
            err = refused or err
            if err is not None:
                log.info("ingest: closing connection: %s (%d)", err.reason, err.code)
                with contextlib.suppress(Exception):
                    await self.ws.close(err.code, err.reason)
        finally:
            for run in self.runs:
                self.svc.tracker.disconnect(run)

    async def _receive(self) -> FrameError | None:
        """Read frames until the client leaves (None) or sends a bad one (the error)."""
        s = self.svc.settings
        try:
            while True:
                msg = await self.ws.receive()
                if msg["type"] == "websocket.disconnect":
                    return None
                text = msg.get("text")
                if text is None:
                    raise FrameError(CLOSE_UNSUPPORTED, "binary frames are not supported; "
                                                        "send JSON text frames")
                check_size(text, s.max_frame_bytes)
                if not self.limiter.allow():
                    raise FrameError(CLOSE_TRY_LATER, f"rate limit: more than "
                                                      f"{s.max_msgs_per_sec:g} frames/s")
                kind, frame = await self.svc.parse(text)
                if kind == "error":
                    raise FrameError(*frame)
                job: cf.Future[Any]
                try:
                    if kind == "hello":
                        job = self.svc.store.submit(self.svc.store.resume_seq, frame.run,
                                                    frame.rank)
                    else:
                        if frame.run not in self.runs:
                            self.runs.add(frame.run)
                            self.svc.tracker.connect(frame.run)
                        job = self.svc.store.submit(self.svc.store.ingest, frame)
                except StoreBusy as e:
                    raise FrameError(CLOSE_TRY_LATER, str(e)) from None
                await self.pending.put((frame, asyncio.wrap_future(job)))
        except FrameError as e:
            return e
        except WebSocketDisconnect:
            return None

    async def _acks(self) -> FrameError | None:
        """Await stored batches in order; ack and publish each, stop at a refused one."""
        while True:
            item = await self.pending.get()
            if item is None:
                return None
            frame, job = item
            try:
                result = await job
            except IngestError as e:
                return FrameError(e.code, e.reason)
            if isinstance(frame, Hello):
                text = Resume(run=frame.run, rank=frame.rank, seq=result).model_dump_json()
            else:
                self.svc.publish(result)
                text = Ack(run=result.run, rank=result.rank, seq=result.ack).model_dump_json()
            try:
                await self.ws.send_text(text)
            except (WebSocketDisconnect, RuntimeError):
                return None


async def _quiet(task: asyncio.Task[Any]) -> Any:
    """A finished (or cancelled) task's result, ``None`` if it was cancelled."""
    try:
        return await task
    except asyncio.CancelledError:
        return None


@router.websocket("/ws/live")
async def live(ws: WebSocket, run: str | None = None,
               max_points: int = Query(4000, ge=10, le=100_000)) -> None:
    """Run list (no ``run``) or one run's snapshot then live frames (see API.md)."""
    svc = await _guard(ws)
    if svc is None:
        return
    await ws.accept()
    client = svc.hub.subscribe(run)
    if client is None:
        await ws.close(CLOSE_TRY_LATER, "too many live clients; retry later")
        return
    try:
        if run is None:
            runs = await asyncio.to_thread(svc.reader.runs)
            await ws.send_text(RunsFrame(runs=runs).model_dump_json())
        else:
            snap = await asyncio.to_thread(_snapshot, svc, run, max_points)
            if snap is None:
                await ws.close(CLOSE_NO_RUN, short(f"no run '{run}'"))
                return
            client.skip_until, frame = snap
            await ws.send_text(frame.model_dump_json())
        await _pump(ws, client, svc.settings.send_timeout)
    finally:
        svc.hub.unsubscribe(client)


def _snapshot(svc: Service, run: str, max_points: int
              ) -> tuple[dict[tuple[int, str], int], SnapshotFrame] | None:
    summary = svc.reader.summary(run)
    if summary is None:
        return None
    last: dict[tuple[int, str], int] = {}
    steps = svc.reader.steps(run, max_points=max_points, last=last)
    findings = svc.reader.findings(run) or []
    if steps is None:
        return None
    frame = SnapshotFrame(run=summary, optimizers=svc.reader.optimizers(run), steps=steps,
                          findings=findings)
    return last, frame


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
                        await ws.close(CLOSE_TRY_LATER, "too slow: dropped")
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
