"""End to end: a real uvicorn server process, a real training loop under the real probe."""

from __future__ import annotations

import json
import statistics
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from live import LiveCollector, live_bytes, stuck_client, wide_records
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.serverproc import ServerProc, free_port

torch = pytest.importorskip("torch")
import gradwatch  # noqa: E402
from gradwatch.steplog import read_log  # noqa: E402
from gradwatch.verdict import verdict_of  # noqa: E402


def make_model() -> tuple[Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def train(model: Any, opt: Any, steps: range, forget_from: int = 10**9,
          pause: float = 0.0, hook: Any = None) -> list[float]:
    """A plain loop; forgets zero_grad from ``forget_from``. Returns per-step seconds."""
    times = []
    for i in steps:
        if hook is not None:
            hook(i)
        t = time.perf_counter()
        if i < forget_from:
            opt.zero_grad()
        model(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()
        times.append(time.perf_counter() - t)
        if pause:
            time.sleep(pause)
    return times


def stored_steps(srv: ServerProc, run: str) -> list[int]:
    return srv.get(f"/api/runs/{run}/steps?max_points=100000")["step"]


def test_steps_in_equal_steps_stored_equal_steps_live(tmp_path: Path) -> None:
    n = 600
    with ServerProc(tmp_path / "data") as srv:
        model, opt = make_model()
        live: LiveCollector | None = None

        def start_live(i: int) -> None:
            nonlocal live
            if i == 150:  # a dashboard opens mid-run: snapshot, then live rows
                live = LiveCollector(srv.ws, "e2e-live")
                live.start()

        with gradwatch.watch(opt, model=model, log=tmp_path / "run.jsonl", server=srv.ws,
                             run_name="live", run_id="e2e-live"):
            train(model, opt, range(n), forget_from=400, pause=0.002, hook=start_live)
        assert live is not None
        live.wait_for(n)
        assert live.error is None, live.error
        log = read_log(tmp_path / "run.jsonl")
        sent = [r.step for r in log.records if r.type == "step"]
        assert sent == list(range(n))
        assert stored_steps(srv, "e2e-live") == sent
        assert sorted(s for _, _, s in live.rows) == sent  # every row once, none twice
        assert not live.decimated and live.status == "finished"
        found = verdict_of([log.header, *log.records]).findings()
        want = [f.model_dump(mode="json") for f in found]
        assert srv.get("/api/runs/e2e-live/findings")["findings"] == want
        assert want[0]["kind"] == "missed_reset" and want[0]["first_step"] == 400


def test_kill9_mid_run_and_restart_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    srv = ServerProc(tmp_path / "data").start()
    model, opt = make_model()
    down: list[float] = []

    orphans: list[int] = []

    def chaos(i: int) -> None:
        if i == 300:
            orphans.extend(srv.children())
            srv.kill9()
        if i == 700:
            srv.start()

    try:
        with gradwatch.watch(opt, model=model, log=tmp_path / "run.jsonl", server=srv.ws,
                             run_id="e2e-kill") as h:
            times = train(model, opt, range(1000), forget_from=800, pause=0.001, hook=chaos)
            down = times[310:690]
            up = times[:290]
        stats = h.streamer.stats()
        assert stats["reconnects"] >= 1 and stats["backlog_bytes"] == 0, stats
        assert stored_steps(srv, "e2e-kill") == list(range(1000))
        run = srv.get("/api/runs/e2e-kill")
        assert run["steps"] == 1000 and run["status"] == "finished"
        f = srv.get("/api/runs/e2e-kill/findings")["findings"]
        assert [(x["kind"], x["first_step"], x["steps"]) for x in f] == \
            [("missed_reset", 800, 200)]
        # the loop did not wait on the dead server
        assert statistics.median(down) < 3 * statistics.median(up) + 0.002
        assert max(down) < 0.5
        # the killed server's parser process followed it (it checks every second)
        deadline = time.monotonic() + 10
        while any(Path(f"/proc/{p}").exists() for p in orphans):
            assert time.monotonic() < deadline, orphans
            time.sleep(0.1)
        assert orphans
    finally:
        srv.stop()


def test_training_before_the_server_exists_arrives_when_it_comes_up(tmp_path: Path) -> None:
    srv = ServerProc(tmp_path / "data", free_port())
    model, opt = make_model()
    try:
        with gradwatch.watch(opt, model=model, log=tmp_path / "run.jsonl", server=srv.ws,
                             run_id="e2e-late"):
            t = time.perf_counter()
            train(model, opt, range(200))
            offline = time.perf_counter() - t
            srv.start()
            train(model, opt, range(200, 300), pause=0.005)
        assert offline < 5.0
        assert stored_steps(srv, "e2e-late") == list(range(300))
    finally:
        srv.stop()


def test_token_and_origin_on_a_real_server(tmp_path: Path, monkeypatch: Any) -> None:
    with ServerProc(tmp_path / "data", None, "--token", "t0ken") as srv:
        with pytest.raises(urllib.error.HTTPError) as e:
            srv.get("/api/runs")
        assert e.value.code == 401
        assert srv.get("/api/runs", token="t0ken") == {"runs": []}
        for path in ("/ws/ingest", "/ws/live"):
            with pytest.raises(InvalidStatus) as ws_e:
                connect(srv.ws + path, open_timeout=5)
            assert ws_e.value.response.status_code == 401
            with pytest.raises(InvalidStatus) as ws_e:
                connect(srv.ws + path + "?token=t0ken", open_timeout=5,
                        origin="http://evil.example")  # type: ignore[arg-type]
            assert ws_e.value.response.status_code == 403
        with connect(srv.ws + "/ws/live?token=t0ken", open_timeout=5,
                     origin=f"http://127.0.0.1:{srv.port}") as ws:  # type: ignore[arg-type]
            assert json.loads(ws.recv(timeout=5))["type"] == "runs"
        monkeypatch.setenv("GRADWATCH_TOKEN", "t0ken")
        model, opt = make_model()
        with gradwatch.watch(opt, model=model, server=srv.ws, run_id="e2e-token",
                             log=tmp_path / "run.jsonl"):
            train(model, opt, range(20))
        assert srv.get("/api/runs/e2e-token", token="t0ken")["steps"] == 20
        req = urllib.request.Request(srv.http + "/healthz")
        with urllib.request.urlopen(req, timeout=5) as r:
            assert r.status == 200



def test_a_stuck_live_client_never_stalls_ingest_or_other_clients(tmp_path: Path) -> None:

    from gradwatch.steplog import StepLogWriter
    from gradwatch.stream import Streamer

    # ~7 MB of live frames (64 param groups' rates a row): more than the kernel buffers of
    # a socket hold
    n = 5_000
    recs = wide_records("stuck", n, groups=64)
    assert live_bytes(recs) > 6 << 20
    with ServerProc(tmp_path / "data", None, "--send-timeout", "1") as srv:
        spool = tmp_path / "spool.jsonl"
        with StepLogWriter(spool) as w:
            for r in recs[:2]:
                w.write(r)
        s = Streamer(srv.ws, spool, "stuck")
        s.start()
        deadline = time.monotonic() + 10
        while s.stats()["acked_seq"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        # a client that never reads: its socket fills up, its queue is decimated
        stuck = stuck_client(srv.port, "/ws/live?run=stuck")
        good = LiveCollector(srv.ws, "stuck")
        good.start()
        time.sleep(0.3)
        with StepLogWriter(spool) as w:
            for r in recs[2:]:
                w.write(r)
        s.notify()
        s.close(timeout=60)  # a stall on the stuck client would leave records unacked
        good.wait_for(n, timeout=30)
        stuck.close()
        assert s.stats()["acked_seq"] == len(recs) - 1
        assert good.error is None and not good.decimated
        assert sorted(st for _, _, st in good.rows) == list(range(n))
        assert srv.get("/api/runs/stuck")["steps"] == n
        assert "live client too slow" in srv.log.read_text()  # it was dropped


def test_a_flush_per_step_stays_under_the_rate_limit(tmp_path: Path) -> None:
    import synth

    from gradwatch.steplog import StepLogWriter
    from gradwatch.stream import Streamer

    recs = synth.records("trickle", steps=3000)
    with ServerProc(tmp_path / "data", None, "--max-msgs-per-sec", "150") as srv:
        spool = tmp_path / "spool.jsonl"
        s = Streamer(srv.ws, spool, "trickle")
        s.start()
        with StepLogWriter(spool, flush_every=0) as w:
            for r in recs:  # ~3000 lines/s, each flushed and notified on its own
                w.write(r)
                s.notify()
                time.sleep(0.0003)
        s.close(timeout=30)
        stats = s.stats()
        assert stats["reconnects"] == 0 and stats["disabled"] is None, stats
        assert srv.get("/api/runs/trickle")["steps"] == 3000


def test_streams_sharing_an_address_share_its_rate_limit_and_slow_down(
        tmp_path: Path) -> None:
    import threading

    import synth

    from gradwatch.steplog import StepLogWriter
    from gradwatch.stream import MIN_INTERVAL, Streamer

    runs = [f"shared{i}" for i in range(4)]
    n = 1500
    closed = threading.Event()
    with ServerProc(tmp_path / "data", None, "--max-msgs-per-sec", "5") as srv:
        streamers = {r: Streamer(srv.ws, tmp_path / f"{r}.jsonl", r) for r in runs}

        def trickle(run: str) -> None:  # a flush per step, as a fast training loop makes
            s = streamers[run]
            recs = synth.records(run, steps=n)
            with StepLogWriter(tmp_path / f"{run}.jsonl", flush_every=0) as w:
                # First a frame per record by construction, not by the speed of this loop:
                # a record is written once the server acked the one before, so the four
                # streams send a frame per round trip each, however loaded the machine,
                # until the server closes one. The shared budget (5 frames/s, bursts of
                # 10) runs out in their first 300 records while the round trips of four
                # streams at once take under 0.8 s.
                i = 0
                while i < 300 and not closed.is_set():
                    w.write(recs[i])
                    s.notify()
                    deadline = time.monotonic() + 30
                    while s.stats().acked_seq < recs[i].seq and not s.stats().reconnects:
                        assert time.monotonic() < deadline, (run, i, s.stats())
                        time.sleep(0.002)
                    if s.stats().reconnects:
                        closed.set()
                    i += 1
                for rec in recs[i:]:  # then a line as fast as the loop makes one
                    w.write(rec)
                    s.notify()
                    time.sleep(0.0005)

        for s in streamers.values():
            s.start()
        threads = [threading.Thread(target=trickle, args=(r,)) for r in runs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for s in streamers.values():
            s.close(timeout=60)
        for r, s in streamers.items():
            assert s.stats()["disabled"] is None, s.stats()
            assert srv.get(f"/api/runs/{r}")["steps"] == n
        # The server closed streams for the address's rate, and those streams sent fuller
        # frames after. (That the connections of an address share one budget is proven on
        # the gate itself, with a fake clock: tests/server/test_limits.py.)
        assert "frames/s from this address" in srv.log.read_text()
        assert any(s.min_interval > MIN_INTERVAL for s in streamers.values())
