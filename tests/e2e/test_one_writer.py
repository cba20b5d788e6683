"""On a real uvicorn process: a stream has one writer, acks are a contiguous prefix, and
hostile numbers close the socket with a clear code (never a traceback).

The probe's streamer sends the key of its step log (``<log>.key``); a stranger's records,
End or far seq for that stream are refused with 4403 while the probe goes on; ``gradwatch
replay --resume`` proves ownership with the same key file.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import synth
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect
from websockets.sync.server import ServerConnection, serve

from gradwatch.frames import Ack, CloseCode, Hello, Resume
from gradwatch.stream import Streamer
from gradwatch.streamkey import key_file, own_key, read_key
from gradwatch.wire import End, IngestBatch
from tests.serverproc import ServerProc


def gw(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gradwatch.cli", *args],
                          capture_output=True, text=True, timeout=timeout)


def closed_with(url: str, frames: list[str]) -> tuple[int | None, str]:
    """Send ``frames`` on a new ingest connection; the close code and reason it gets."""
    # The server may close before the last frames are sent (a refused hello): a send then
    # raises with its close frame, as a receive would.
    with connect(f"{url}/ws/ingest", open_timeout=5) as ws, \
            pytest.raises(ConnectionClosed) as e:
        for f in frames:
            ws.send(f)
        while True:
            ws.recv(timeout=10)
    rcvd = e.value.rcvd
    return (rcvd.code, rcvd.reason) if rcvd is not None else (None, "")


def streaming(srv: ServerProc, log: Path, run: str, **kw: Any) -> Streamer:
    """A probe's streamer of ``log`` into ``srv``, with the log's own key, started."""
    s = Streamer(srv.ws, log, run, key=own_key(log), **kw)
    s.start()
    s.notify()
    return s


def wait(cond: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_stranger_cannot_end_or_advance_a_streaming_run(tmp_path: Path) -> None:
    recs = synth.records("owned", steps=200)
    log = tmp_path / "owned.jsonl"
    log.write_text(synth.log_text(recs[:100]))
    with ServerProc(tmp_path / "data") as srv:
        s = streaming(srv, log, "owned")
        wait(lambda: s.stats()["acked_seq"] == 99)
        end = IngestBatch(run="owned", records=[End(seq=100, t=1001.0)]).model_dump_json()
        far = IngestBatch(run="owned", records=[synth.step(10**6, 10**6)]).model_dump_json()
        for frames in ([end], [far], [Hello(run="owned", key="x" * 32).model_dump_json(),
                                      end]):
            code, reason = closed_with(srv.ws, frames)
            assert code == 4403 and "belongs to" in reason, (code, reason)
        assert srv.get("/api/runs/owned")["status"] == "live"
        with log.open("a") as fh:
            fh.write(synth.log_text(recs[100:]))
        s.notify()
        s.close(timeout=20)
        assert s.stats()["acked_seq"] == len(recs) - 1 and s.stats()["disabled"] is None
        got = srv.get("/api/runs/owned")
        assert got["steps"] == 200 and got["status"] == "finished"
    assert "Traceback" not in srv.log.read_text()  # refusals are answers, not crashes


def test_a_streamer_without_the_key_stops_and_says_it_was_refused_as_not_owner(
        tmp_path: Path) -> None:
    recs = synth.records("mine", steps=20, end=False)
    log = tmp_path / "mine.jsonl"
    log.write_text(synth.log_text(recs))
    with ServerProc(tmp_path / "data") as srv:
        s = streaming(srv, log, "mine")
        s.close(timeout=20)
        assert s.stats().acked_seq == len(recs) - 1 and s.stats().refused is None
        other = Streamer(srv.ws, log, "mine", key="k" * 32)
        other.start()
        other.notify()
        other.close(timeout=10)
        st = other.stats()
        assert st.refused is CloseCode.NOT_OWNER, st
        assert st.disabled is not None and "belongs to" in st.disabled
        assert st.sent == 0 and st["disabled"] == st.disabled  # also read as a mapping
        assert srv.get("/api/runs/mine")["steps"] == 20


def _delete(srv: ServerProc, run: str) -> tuple[int, str]:
    req = urllib.request.Request(f"{srv.http}/api/runs/{run}", method="DELETE")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, ""
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())["detail"]


def test_a_live_keyed_run_cannot_be_deleted_and_re_created_by_a_stranger(
        tmp_path: Path) -> None:
    recs = synth.records("victim", steps=100)
    log = tmp_path / "victim.jsonl"
    log.write_text(synth.log_text(recs[:60]))
    with ServerProc(tmp_path / "data") as srv:
        s = streaming(srv, log, "victim")
        wait(lambda: s.stats()["acked_seq"] == 59)
        status, detail = _delete(srv, "victim")
        assert status == 409 and detail == ("run victim is live: it can be deleted once it "
                                            "has ended (or reads as interrupted, its stream "
                                            "gone)")
        # the stranger's re-creation under its own key finds the run still the probe's
        stranger = [Hello(run="victim", key="s" * 32).model_dump_json(),
                    synth.batches(recs[:5], run="victim")[0]]
        code, reason = closed_with(srv.ws, stranger)
        assert code == 4403 and "belongs to" in reason, (code, reason)
        with log.open("a") as fh:
            fh.write(synth.log_text(recs[60:]))
        s.notify()
        s.close(timeout=20)
        assert s.stats()["disabled"] is None
        assert srv.get("/api/runs/victim")["status"] == "finished"
        assert _delete(srv, "victim") == (204, "")  # ended: the user may delete it
        assert srv.get("/api/runs") == {"runs": []}
        keyless = synth.records("open", steps=5, end=False)
        with connect(f"{srv.ws}/ws/ingest", open_timeout=5) as ws:
            ws.send(synth.batches(keyless, run="open")[0])
            ws.recv(timeout=10)
            assert _delete(srv, "open") == (204, "")  # a keyless live run: as before


def test_replay_resume_proves_ownership_with_the_log_key(tmp_path: Path) -> None:
    recs = synth.records("resumed", steps=100)
    log = tmp_path / "run.jsonl"
    log.write_text(synth.log_text(recs[:50]))
    with ServerProc(tmp_path / "data") as srv:
        s = streaming(srv, log, "resumed")
        s.close(timeout=20)
        assert s.stats()["acked_seq"] == 49
        log.write_text(synth.log_text(recs))
        key = key_file(log).read_text()
        key_file(log).unlink()
        r = gw("replay", str(log), "--server", srv.ws, "--resume", "--timeout", "5")
        assert r.returncode == 1 and "belongs to" in r.stderr, r.stdout + r.stderr
        assert f"kept the stream's key in {key_file(log)}" in r.stderr  # told by its 4403
        assert srv.get("/api/runs/resumed")["steps"] == 48
        key_file(log).write_text(key)  # put back, but readable by others: not used
        r = gw("replay", str(log), "--server", srv.ws, "--resume", "--timeout", "5")
        assert r.returncode == 1 and "is open to other users (mode 0644" in r.stderr
        key_file(log).chmod(0o600)
        r = gw("replay", str(log), "--server", srv.ws, "--resume")
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"the server had 50 records, sent {len(recs) - 50}" in r.stdout
        assert srv.get("/api/runs/resumed")["status"] == "finished"


def test_a_spool_gap_holds_the_ack_without_stalling_the_streamer(tmp_path: Path) -> None:
    recs = synth.records("holed", steps=60)
    lines = synth.log_text(recs).splitlines()
    lines[30] = lines[30].replace('"t":', '"t":"NaN","x":')  # unreadable: seq 30 is lost
    log = tmp_path / "holed.jsonl"
    log.write_text("\n".join(lines) + "\n")
    with ServerProc(tmp_path / "data") as srv:
        s = streaming(srv, log, "holed", max_records=10)
        t = time.monotonic()
        s.close(timeout=15)
        assert time.monotonic() - t < 5  # every batch was acked: nothing waits on the gap
        st = s.stats()
        assert st["acked_seq"] == 29 and st["sent"] == len(recs) - 1 and st["dropped"] == 1
        assert srv.get("/api/runs/holed")["steps"] == 59
        with connect(f"{srv.ws}/ws/ingest") as ws:
            ws.send(Hello(run="holed", key=read_key(log)).model_dump_json())
            assert json.loads(ws.recv(timeout=10))["seq"] == 29


@pytest.mark.parametrize(("field", "value"), [
    ("t", "NaN"), ("t", "1e999"), ("stale", str(2**64)), ("seq", str(2**70)),
    ("stale", "9" * 5000), ("t", "1" * 5000)])
def test_hostile_numbers_close_1007_and_import_400_without_a_traceback(
        tmp_path: Path, field: str, value: str) -> None:
    lines = [json.loads(r.model_dump_json()) for r in synth.records("bad", steps=3)]
    lines[2][field] = "@@"
    text = [json.dumps(x).replace('"@@"', value) for x in lines]
    frame = '{"type":"batch","v":1,"run":"bad","rank":0,"records":[' + ",".join(text) + "]}"
    with ServerProc(tmp_path / "data") as srv:
        code, reason = closed_with(srv.ws, [frame])
        assert code == 1007 and ("number" in reason or field in reason), reason
        req = urllib.request.Request(
            f"{srv.http}/api/runs/import", data=("\n".join(text) + "\n").encode(),
            headers={"Content-Type": "application/x-ndjson"}, method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=30)
        assert e.value.code == 400
        assert srv.get("/api/runs") == {"runs": []}
    assert "Traceback" not in srv.log.read_text()


class OldServer:
    """An ingest server from before stream keys: it refuses a hello's ``key`` (1007), and
    otherwise stores and acks like the real one (highest seq of contiguous records)."""

    def __init__(self) -> None:
        self.hellos: list[dict[str, Any]] = []
        self.seqs: set[int] = set()
        self.server = serve(self._handle, "127.0.0.1", 0)
        self.url = f"ws://127.0.0.1:{self.server.socket.getsockname()[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _ack(self) -> int:
        n = -1
        while n + 1 in self.seqs:
            n += 1
        return n

    def _handle(self, ws: ServerConnection) -> None:
        for text in ws:
            m = json.loads(text)
            if m["type"] == "hello":
                self.hellos.append(m)
                if "key" in m:
                    ws.close(1007, "invalid frame at hello.key: Extra inputs are not "
                                   "permitted")
                    return
                ws.send(Resume(run=m["run"], rank=0, seq=self._ack()).model_dump_json())
            else:
                self.seqs.update(r["seq"] for r in m["records"])
                ws.send(Ack(run=m["run"], rank=0, seq=self._ack()).model_dump_json())


def test_a_server_from_before_keys_gets_a_keyless_stream(tmp_path: Path) -> None:
    recs = synth.records("old", steps=30)
    log = tmp_path / "old.jsonl"
    log.write_text(synth.log_text(recs))
    old = OldServer()
    try:
        s = Streamer(old.url, log, "old", key=own_key(log))
        s.start()
        s.notify()
        s.close(timeout=15)
        assert s.stats()["acked_seq"] == len(recs) - 1 and s.stats()["disabled"] is None
        assert ["key" in h for h in old.hellos] == [True, False]
    finally:
        old.server.shutdown()
