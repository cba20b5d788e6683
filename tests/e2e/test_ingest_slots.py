"""On a real server: one local client holding ingest sockets cannot lock probes out.
Sockets that send no first frame are dropped within the hello deadline; a quarter of the
connections is kept for streams the server already keeps, so a probe that owns one gets
back in while a client keeps the rest busy; a probe refused says so and keeps its records
for when the server takes them."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from pathlib import Path

import pytest
import synth
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from gradwatch.frames import Hello
from gradwatch.stream import Streamer
from gradwatch.streamkey import own_key
from tests.serverproc import ServerProc

SLOTS = ["--max-ingest-connections", "8", "--ingest-hello-timeout", "2"]


def wait(cond: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def streaming(srv: ServerProc, log: Path, run: str) -> Streamer:
    s = Streamer(srv.ws, log, run, key=own_key(log), max_backoff=0.5)
    s.start()
    s.notify()
    return s


def test_sockets_that_say_nothing_are_dropped_and_a_probe_gets_in(tmp_path: Path) -> None:
    with ServerProc(tmp_path / "data", None, *SLOTS) as srv:
        closes = []
        with contextlib.ExitStack() as stack:
            idle = [stack.enter_context(connect(f"{srv.ws}/ws/ingest", open_timeout=5))
                    for _ in range(8)]
            for ws in idle:
                with pytest.raises(ConnectionClosed) as e:
                    ws.recv(timeout=10)
                assert e.value.rcvd is not None
                closes.append((e.value.rcvd.code, e.value.rcvd.reason))
        assert set(closes) == {(1001, "no frame within 2 s of connecting: closed; send a "
                                      "hello first")}
        log = tmp_path / "after.jsonl"
        log.write_text(synth.log_text(synth.records("after", steps=20)))
        s = streaming(srv, log, "after")
        s.close(timeout=20)
        assert s.stats()["acked_seq"] == 22 and s.stats()["disabled"] is None


class Hog:
    """A client keeping ``n`` ingest sockets alive with a hello each second."""

    def __init__(self, url: str, n: int):
        self._stack = contextlib.ExitStack()
        self.socks: list[ClientConnection] = [
            self._stack.enter_context(connect(f"{url}/ws/ingest", open_timeout=5))
            for _ in range(n)]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep, daemon=True)
        self._thread.start()

    def _keep(self) -> None:
        while not self._stop.is_set():
            for i, ws in enumerate(self.socks):
                ws.send(Hello(run=f"hog-{i}").model_dump_json())
                ws.recv(timeout=10)
            self._stop.wait(1.0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._stack.close()


def test_a_client_holding_the_sockets_leaves_room_for_owned_streams(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    owned = synth.records("owned", steps=40)
    log = tmp_path / "owned.jsonl"
    log.write_text(synth.log_text(owned[:20]))
    with ServerProc(tmp_path / "data", None, *SLOTS) as srv:
        first = streaming(srv, log, "owned")
        wait(lambda: first.stats()["acked_seq"] == 19)
        first.close(timeout=5)
        hog = Hog(srv.ws, 6)  # every connection but the quarter kept for owned streams
        try:
            time.sleep(3)  # past the hello deadline: the hog's sockets stay, they said hello
            new_log = tmp_path / "newcomer.jsonl"
            new_log.write_text(synth.log_text(synth.records("newcomer", steps=10)))
            with caplog.at_level(logging.WARNING, logger="gradwatch"):
                newcomer = streaming(srv, new_log, "newcomer")
                wait(lambda: any("refused the stream for now" in r.getMessage()
                                 for r in caplog.records))
            said = [r.getMessage() for r in caplog.records
                    if "refused the stream for now" in r.getMessage()]
            assert len(said) == 1 and "kept for streams the server already keeps" in said[0]
            assert str(new_log) in said[0]
            assert not newcomer.stats()["connected"]
            # the probe that owns a stream the server keeps gets back in meanwhile
            with log.open("a") as fh:
                fh.write(synth.log_text(owned[20:]))
            back = streaming(srv, log, "owned")
            back.close(timeout=20)
            assert back.stats()["acked_seq"] == len(owned) - 1
            assert srv.get("/api/runs/owned")["status"] == "finished"
            assert "newcomer" not in {r["id"] for r in srv.get("/api/runs")["runs"]}
        finally:
            hog.close()
        newcomer.close(timeout=20)  # the hog gone, its records arrive from its spool
        assert newcomer.stats()["acked_seq"] == 12
        assert srv.get("/api/runs/newcomer")["steps"] == 10
