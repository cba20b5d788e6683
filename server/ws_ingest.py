"""One ``/ws/ingest`` connection: frames read, validated, stored and acked in order.

Pipelined: frame k+1 is read and validated while frame k is being stored; acks go out in
frame order. The first refused frame closes the connection (code from
:mod:`server.ws_close`) after the valid frames before it are stored and acked. The key of
a connection's last ``hello`` per (run, rank) goes with each of its batches to storage,
which refuses a keyed stream's batch without it (:mod:`server.owners`).

A client that sends faster than its frames are stored (more than the pipeline holds
unacked; the probe never does, it waits for acks and fills its frames meanwhile) has its
frames of one stream merged while the pipeline is full, up to :data:`MERGE` a batch
(:data:`MERGE_RECORDS` records), so
the writer stores them in one transaction (each still acked, in order, with the
stream's ack once stored) and the stream keeps pace instead of its frames queueing in
the socket; frames merged are stored or refused together. Small frames (at most
:data:`LIVE_RECORDS` records each: a probe keeping pace) go ahead of other runs' queued
batches at the writer.

The first frame must arrive within ``ingest_hello_timeout`` (a socket that sends nothing
only holds a slot); a connection the gate admitted on trial (:class:`~server.limits.
IngestGate`) must open with a hello whose key owns a stream the server keeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, NamedTuple, TypeVar

from fastapi import WebSocket, WebSocketDisconnect

from gradwatch.frames import Ack, Hello, Resume
from gradwatch.server.batch import Batch, IngestResult
from gradwatch.server.errors import IdleConnection, Refused, SlowReader, UnreadableFrame
from gradwatch.server.limits import RateLimiter, check_size, within
from gradwatch.server.runs import Runs
from gradwatch.server.ws_close import close_code, short

log = logging.getLogger(__name__)
T = TypeVar("T")

MERGE = 16
"""Frames of one stream merged into one batch at most (while the pipeline is full)."""
MERGE_RECORDS = 500
"""Records of one merged batch at most (a frame bigger goes alone): the writer stores no
faster per record in bigger batches, and a live client's batch waits for the one being
stored (:mod:`server.writerthread` puts it ahead of those queued only)."""
LIVE_RECORDS = 32
"""Frames of at most this many records are a live client's: the writer stores their batch
(merged or not) ahead of other runs' queued batches (:mod:`server.writerthread`), so a
dashboard following a run that trains at its own pace does not wait behind other
streams' bulk frames."""


class _Resuming(NamedTuple):
    hello: Hello
    seq: asyncio.Future[int]
    """The highest stored seq of the stream, once the writer read it."""


class _Storing(NamedTuple):
    result: asyncio.Future[IngestResult]
    frames: int = 1
    """Frames merged into the batch: one ack each."""


class IngestSession:
    """One ingest connection, from its first frame to its close."""

    PIPELINE = 4
    """Frames validated and handed to the writer ahead of their acks."""

    def __init__(self, ws: WebSocket, runs: Runs, limiter: RateLimiter, trial: bool = False):
        """``limiter``: the frame-rate budget of the client's address (shared); ``trial``:
        admitted in the room kept for owned streams (its first hello must prove one)."""
        self.ws, self.runs = ws, runs
        self.limiter = limiter
        self.trial = trial
        """Still on trial (cleared once its hello proved an owned stream)."""
        self.pending: asyncio.Queue[_Resuming | _Storing | None] = asyncio.Queue(
            self.PIPELINE)
        self._room = asyncio.Event()
        """Set when the acker takes a job out of :attr:`pending`."""
        self.sending_to: set[str] = set()
        """Runs this connection has stored batches in."""
        self.keys: dict[tuple[str, int], str | None] = {}
        """The key each (run, rank) hello of this connection carried (the last one)."""

    async def run(self) -> None:
        """Serve the connection until the client leaves or a frame is refused."""
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
                code = close_code(err)
                log.info("ingest: closing connection: %s (%d)", err.reason, code)
                with contextlib.suppress(Exception):
                    await within(self.ws.close(code, short(err.reason)), 1.0)
        finally:
            while not self.pending.empty():  # frames after a refused one: never acked
                job = self.pending.get_nowait()
                if job is not None:
                    _forget(job.seq if isinstance(job, _Resuming) else job.result)
            for run in self.sending_to:
                self.runs.streams.disconnect(run)

    async def _receive(self) -> Refused | None:
        """Read frames until the client leaves (None) or sends a refused one (the error)."""
        s = self.runs.settings
        first = True
        held: list[Batch] = []  # frames of one stream read while the pipeline was full
        recv: asyncio.Future[Any] | None = None
        try:
            while True:
                wait = min(s.ingest_hello_timeout, s.ingest_idle_timeout) if first else \
                    s.ingest_idle_timeout
                if recv is None:
                    recv = asyncio.ensure_future(within(self.ws.receive(), wait))
                if held and not await self._room_or(recv):
                    await self._store(held)  # room first: the frames merged so far go
                    held = []
                    continue
                try:
                    msg = await recv
                except asyncio.TimeoutError:
                    if held:  # not idle: its frames were waiting for room
                        recv = None
                        continue
                    raise IdleConnection(
                        f"no frame within {wait:g} s of connecting: closed; send a hello "
                        f"first" if first else f"idle for {wait:g} s: closed; reconnect to "
                        f"send more") from None
                finally:
                    if recv is not None and recv.done():
                        recv = None
                if msg["type"] == "websocket.disconnect":
                    self._store_unacked(held)  # read, so stored, as every frame read
                    return None
                text = msg.get("text")
                if text is None:
                    raise UnreadableFrame("binary frames are not supported; send JSON text "
                                          "frames")
                check_size(text, s.max_frame_bytes)
                self.limiter.take()
                frame = await self.runs.parser.parse(text)
                if first and self.trial:
                    await self._prove(frame)
                first = False
                if not isinstance(frame, Hello) and held and _joins(held, frame):
                    held.append(frame)
                    continue
                await self._store(held)
                held = []
                if isinstance(frame, Hello):
                    self.keys[frame.run, frame.rank] = frame.key
                    store = self.runs.store
                    await self.pending.put(_Resuming(frame, asyncio.wrap_future(
                        store.submit(store.resume_seq, frame.run, frame.rank, frame.key,
                                     run=frame.run))))
                elif self.pending.full():
                    held = [frame]  # merged with the next frames until there is room
                else:
                    await self._store([frame])
        except Refused as e:
            with contextlib.suppress(Refused):  # a busy store refuses those too
                await self._store(held)  # read before the refused frame: stored, acked
            return e
        except WebSocketDisconnect:
            self._store_unacked(held)
            return None
        finally:
            if recv is not None:
                recv.cancel()

    async def _room_or(self, recv: asyncio.Future[Any]) -> bool:
        """Wait for room in the pipeline or for ``recv`` to finish; True if ``recv`` did
        (or both)."""
        room = asyncio.ensure_future(self._room_for_one())
        try:
            await asyncio.wait({recv, room}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            room.cancel()
        return recv.done()

    async def _room_for_one(self) -> None:
        while self.pending.full():
            self._room.clear()
            await self._room.wait()

    def _submit(self, frames: list[Batch]) -> asyncio.Future[IngestResult]:
        """Hand frames of one stream to the writer as one batch."""
        f = frames[0]
        batch = f if len(frames) == 1 else Batch(
            f.run, f.rank, [e for b in frames for e in b.entries])
        store = self.runs.store
        return asyncio.wrap_future(store.submit(
            store.ingest, batch, None, self.keys.get((f.run, f.rank)), run=f.run,
            urgent=all(len(b.entries) <= LIVE_RECORDS for b in frames)))

    async def _store(self, frames: list[Batch]) -> None:
        """Store frames of one stream as one batch, acked in turn (none: nothing)."""
        if frames:
            job = _Storing(self._submit(frames), len(frames))
            await self.pending.put(job)

    def _store_unacked(self, frames: list[Batch]) -> None:
        """Store frames of a client that left (nothing to ack; a busy store: not)."""
        if frames:
            with contextlib.suppress(Refused):
                _forget(self._submit(frames))

    async def _prove(self, frame: Any) -> None:
        """Keep a connection on trial only if ``frame`` is a hello holding the key of a
        stream the server keeps.

        Raises:
            TooManyConnections: it is not.
        """
        store = self.runs.store
        if isinstance(frame, Hello) and frame.key is not None and await asyncio.wrap_future(
                store.submit(store.owns, frame.run, frame.rank, frame.key, run=frame.run)):
            self.trial = False
            self.runs.gate.proven()
            return
        raise self.runs.gate.refuse_trial()

    async def _acks(self) -> Refused | None:
        """Await stored batches in order; ack and publish each, stop at a refused one."""
        while True:
            job = await self.pending.get()
            self._room.set()
            if job is None:
                return None
            try:
                if isinstance(job, _Resuming):
                    h = job.hello
                    text = Resume(run=h.run, rank=h.rank, seq=await job.seq).model_dump_json()
                else:
                    res = await job.result
                    if res.run not in self.sending_to:  # stored: this connection feeds it
                        self.sending_to.add(res.run)
                        self.runs.streams.connect(res.run)
                    self.runs.publish(res)
                    text = Ack(run=res.run, rank=res.rank, seq=res.ack).model_dump_json()
            except Refused as e:
                return e
            timeout = self.runs.settings.send_timeout
            # one ack per frame; merged frames were stored together: their acks alike
            for _ in range(job.frames if isinstance(job, _Storing) else 1):
                try:
                    await within(self.ws.send_text(text), timeout)
                except asyncio.TimeoutError:  # it must not hold a slot by not reading
                    return SlowReader(f"acks not read for {timeout:g} s: closed")
                except (WebSocketDisconnect, RuntimeError):
                    return None


def _joins(held: list[Batch], frame: Batch) -> bool:
    """Whether ``frame`` can be merged after ``held`` (the same stream, in seq order)."""
    last = held[-1]
    return (len(held) < MERGE and frame.run == last.run and frame.rank == last.rank
            and sum(len(b.entries) for b in held) + len(frame.entries) <= MERGE_RECORDS
            and bool(frame.entries) and bool(last.entries)
            and frame.entries[0].seq > last.entries[-1].seq)


def _forget(fut: asyncio.Future[Any]) -> None:
    """Drop a stored (or refused) frame's outcome without asyncio logging it as lost."""
    fut.add_done_callback(lambda f: None if f.cancelled() else f.exception())


async def _quiet(task: asyncio.Task[T]) -> T | None:
    """A finished (or cancelled) task's result, ``None`` if it was cancelled."""
    try:
        return await task
    except asyncio.CancelledError:
        return None
