"""Dashboard sockets that never read, on a real server: they cannot stall its event loop,
slow a healthy dashboard down, or keep their live slots."""

from __future__ import annotations

import json
import time
from pathlib import Path

import synth
from live import LiveCollector, Pinger, live_bytes, stuck_client, wide_records
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from gradwatch.steplog import StepLogWriter
from gradwatch.stream import Streamer
from tests.serverproc import ServerProc


def test_clients_that_never_read_do_not_freeze_the_server(tmp_path: Path) -> None:
    # A live row carries each param group's learning rate: 64 groups (layer-wise rates)
    # make ~1.5 KB a row, so 5,000 steps make ~7 MB of live frames, more than the kernel
    # buffers for a socket (4 MiB here): a client that does not read blocks its socket
    # midway.
    stored, n, crowd = 200, 5_000, 30
    recs = wide_records("crowd", stored + n, groups=64)
    assert live_bytes(recs) > 6 << 20
    head = stored + 2  # header, optimizer, the stored steps
    with ServerProc(tmp_path / "data", None, "--max-live-clients", str(crowd + 1),
                    "--send-timeout", "3") as srv:
        spool = tmp_path / "spool.jsonl"
        with StepLogWriter(spool) as w:
            for r in recs[:head]:
                w.write(r)
        # Small batches, as a probe flushing every step sends: many live frames (more than
        # a client's queue of 256 holds).
        s = Streamer(srv.ws, spool, "crowd", max_records=10)
        s.start()
        deadline = time.monotonic() + 60
        while s.stats()["acked_seq"] < head - 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        stuck = [stuck_client(srv.port, "/ws/live?run=crowd") for _ in range(crowd)]
        good = LiveCollector(srv.ws, "crowd")
        good.start()
        pinger = Pinger(srv.http)
        pinger.start()
        with StepLogWriter(spool) as w:
            for r in recs[head:]:
                w.write(r)
        s.notify()
        s.close(timeout=120)
        # The stuck ones are dropped (1013), so their slots come free: with the limit at
        # crowd + 1 (the healthy one holds one), another dashboard gets in.
        deadline = time.monotonic() + 20
        while not _runs_frame(srv.ws + "/ws/live"):
            assert time.monotonic() < deadline, "the stuck clients still hold their slots"
            time.sleep(0.5)
        good.wait_for(stored + n, timeout=30)
        rtts = pinger.stop()
        assert s.stats()["acked_seq"] == len(recs) - 1
        assert good.error is None, good.error
        # The healthy dashboard kept up: every row, none merged away.
        assert sorted({st for _, _, st in good.rows}) == list(range(stored + n))
        assert not good.decimated
        # The event loop kept answering: /healthz every 50 ms never took long.
        assert max(rtts) < 1.0, sorted(rtts)[-5:]
        assert "live client too slow" in srv.log.read_text()
        for sock in stuck:
            sock.close()


def _runs_frame(url: str) -> bool:
    """Whether a new dashboard socket gets the run list (not 1013: too many clients)."""
    try:
        with connect(url, open_timeout=5) as ws:
            return bool(json.loads(ws.recv(timeout=10))["type"] == "runs")
    except ConnectionClosed:
        return False


def test_clients_that_never_read_a_finished_run_give_their_slots_back(tmp_path: Path) -> None:
    crowd = 5
    with ServerProc(tmp_path / "data", None, "--max-live-clients", str(crowd),
                    "--ping-interval", "1", "--ping-timeout", "1") as srv:
        spool = tmp_path / "spool.jsonl"
        with StepLogWriter(spool) as w:
            for r in synth.records("done", steps=20):
                w.write(r)
        s = Streamer(srv.ws, spool, "done")
        s.start()
        s.close(timeout=30)
        # Each takes its snapshot into its socket buffer and then never reads: nothing
        # more is ever sent to it, so only an unanswered ping can tell.
        stuck = [stuck_client(srv.port, "/ws/live?run=done") for _ in range(crowd)]
        assert not _runs_frame(srv.ws + "/ws/live")  # every slot is taken
        deadline = time.monotonic() + 15
        while not _runs_frame(srv.ws + "/ws/live"):
            assert time.monotonic() < deadline, "the silent clients still hold their slots"
            time.sleep(0.5)
        for sock in stuck:
            sock.close()
