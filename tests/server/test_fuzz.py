"""Property-based fuzzing: ingest frames, uploaded logs, Host and Origin headers, and
writers racing for one stream. The server stays up, bad frames get a close code, bad
uploads a 4xx, foreign names and origins a 403, strangers to a keyed stream a 4403, and
nothing already stored changes; the ack is always the owner's contiguous prefix."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import synth
from apps import TESTCLIENT_HOST, app_settings
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.websockets import WebSocketDisconnect

from gradwatch.frames import Hello
from gradwatch.server import Settings, create_app
from gradwatch.wire import IngestBatch

BASE = json.loads(synth.batches(synth.records(steps=3, end=False), size=100)[0])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)


PAST_64_BITS = st.integers(2**63, 2**90) | st.integers(-2**90, -1)
TOO_LONG = st.integers(4301, 6000).map(lambda n: "9" * n)
"""Integers too long to parse at all (Python's 4300-digit limit): still a clear 1007."""
HOSTILE = {  # JSON text of values each kind of field must refuse
    "count": PAST_64_BITS.map(str) | TOO_LONG,
    "step": (PAST_64_BITS | st.integers(2**53, 2**63 - 1)).map(str),
    "time": st.sampled_from(["NaN", "Infinity", "-Infinity", '"NaN"', '"Infinity"',
                             '"-Infinity"', "1e400", "-1e999"]),
}
BOUNDED = {  # per record type, its fields that must be finite or within 64 bits
    "header": {"seq": "count", "t": "time", "started": "time", "pid": "count",
               "norms_every": "count", "world_size": "count", "rank": "count"},
    "optimizer": {"seq": "count", "t": "time"},
    "step": {"seq": "count", "t": "time", "step": "step", "backwards": "count",
             "consumed": "count", "fresh": "count", "stale": "count", "leaked": "count",
             "discarded": "count"},
}


@st.composite
def hostile_lines(draw: st.DrawFn) -> list[str]:
    """The records of a valid frame as JSON lines, one bounded number set past its bounds."""
    recs: list[Any] = json.loads(json.dumps(BASE["records"]))
    rec = draw(st.sampled_from(recs))
    field = draw(st.sampled_from(sorted(BOUNDED[rec["type"]])))
    rec[field] = "@@"
    value = draw(HOSTILE[BOUNDED[rec["type"]][field]])
    return [json.dumps(r).replace('"@@"', value) for r in recs]


def frame_of(lines: list[str]) -> str:
    return ('{"type":"batch","v":1,"run":"run1","rank":0,"records":[' + ",".join(lines)
            + "]}")


@st.composite
def mutated(draw: st.DrawFn) -> str | bytes:
    """A valid frame with one thing broken, or garbage."""
    kind = draw(st.sampled_from(["field", "record", "drop", "garbage", "bytes", "type",
                                 "hostile"]))
    frame: Any = json.loads(json.dumps(BASE))
    if kind == "hostile":
        return frame_of(draw(hostile_lines()))
    if kind == "garbage":
        return draw(st.text(max_size=200))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "field":
        frame[draw(st.sampled_from(["v", "run", "rank", "records", "type"]))] = \
            draw(json_values)
    elif kind == "drop":
        rec = draw(st.sampled_from(frame["records"]))
        rec.pop(draw(st.sampled_from(sorted(rec))))
    elif kind == "type":
        frame = draw(json_values)
    else:
        rec = draw(st.sampled_from(frame["records"]))
        rec[draw(st.sampled_from(sorted(rec)))] = draw(json_values)
    return json.dumps(frame)


def snapshot(client: TestClient) -> Any:
    return (client.get("/api/runs/run1/steps").json(),
            client.get("/api/runs/run1/findings").json(),
            client.get("/api/runs/run1").json()["steps"])


def test_fuzzed_frames_never_hurt_the_server(tmp_path: Path) -> None:
    with TestClient(create_app(app_settings(data_dir=tmp_path))) as client:
        with client.websocket_connect("/ws/ingest") as ws:
            for f in synth.batches(synth.records(steps=30, stale_from=10), size=50):
                ws.send_text(f)
                ws.receive_json()
        before = [snapshot(client)]
        codes: set[int] = set()

        @settings(max_examples=150, deadline=None,
                  suppress_health_check=[HealthCheck.too_slow])
        @given(mutated())
        def check(frame: str | bytes) -> None:
            with client.websocket_connect("/ws/ingest") as ws:
                if isinstance(frame, bytes):
                    ws.send_bytes(frame)
                else:
                    ws.send_text(frame)
                try:
                    answer = ws.receive_json()
                except WebSocketDisconnect as e:
                    codes.add(e.code)
                    assert e.code in (1003, 1007, 1008, 1009) and e.reason
                    assert len(e.reason.encode()) <= 123
                    assert snapshot(client) == before[0]
                    return
                assert answer["type"] in ("ack", "resume")
                before[0] = snapshot(client)  # a frame that happened to be valid

        check()
        assert client.get("/healthz").json()["status"] == "ok"
        assert {1003, 1007} <= codes


def test_hostile_numbers_are_refused_by_name_on_ingest_and_import(tmp_path: Path) -> None:
    with TestClient(create_app(app_settings(data_dir=tmp_path))) as client:

        @settings(max_examples=80, deadline=None,
                  suppress_health_check=[HealthCheck.too_slow])
        @given(hostile_lines())
        def check(lines: list[str]) -> None:
            with client.websocket_connect("/ws/ingest") as ws:
                ws.send_text(frame_of(lines))
                try:
                    answer = ws.receive_json()
                except WebSocketDisconnect as e:
                    assert e.code == 1007, (e.code, e.reason)
                    assert re.match(r"invalid frame: (field '\w+.*' of record \d+ \('\w+'\) is "
                                    r"|number out of range)", e.reason), \
                        e.reason
                else:
                    raise AssertionError(f"a hostile frame was taken: {answer}")
            r = client.post("/api/runs/import", content="\n".join(lines) + "\n",
                            headers={"content-type": "application/x-ndjson"})
            assert r.status_code == 400 and r.json()["detail"].startswith("upload:"), r.text

        check()
        assert client.get("/api/runs").json() == {"runs": []}


HOSTS = st.one_of(
    st.text(max_size=30),
    st.from_regex(r"[a-z][a-z0-9-]{0,15}(\.[a-z]{2,6}){1,2}(:[0-9]{1,5})?", fullmatch=True),
    st.sampled_from(["localhost.evil.example", "127.0.0.1.nip.io", "0.0.0.0", "[::]:80",
                     "10.0.0.1:8765", "[::ffff:127.0.0.1]", "evil.example:8765"]))
LOOPBACK = st.tuples(
    st.sampled_from(["localhost", "LocalHost", "localhost.", "127.0.0.1", "127.255.0.9",
                     "[::1]"]),
    st.sampled_from(["", ":80", ":8765", ":65535"])).map("".join)


def test_fuzzed_host_headers_reach_nothing_but_loopback_names(tmp_path: Path) -> None:
    with TestClient(create_app(Settings(data_dir=tmp_path))) as client:

        @settings(max_examples=150, deadline=None,
                  suppress_health_check=[HealthCheck.too_slow])
        @given(HOSTS, LOOPBACK, st.sampled_from(["/api/runs", "/", "/healthz"]))
        def check(host: str, loopback: str, path: str) -> None:
            try:
                host.encode("ascii")
            except UnicodeEncodeError:
                return  # not a header value an HTTP client can send
            r = client.get(path, headers={"host": host})
            assert r.status_code in (400, 403), (host, r.status_code)  # never an answer
            assert client.get(path, headers={"host": loopback}).status_code == 200, loopback

        check()


ORIGINS = st.one_of(
    st.just("null"), st.text(max_size=30),
    st.builds(lambda scheme, host, port: f"{scheme}://{host}{port}",
              st.sampled_from(["http", "https", "ws", "file", "chrome-extension"]),
              st.sampled_from(["evil.example", "127.0.0.1", "localhost", "testserver.evil",
                               TESTCLIENT_HOST]),
              st.sampled_from(["", ":80", ":8765", ":1"])))


def test_fuzzed_origins_cannot_write_unless_they_are_the_servers_own(tmp_path: Path) -> None:
    log = synth.log_text(synth.records(steps=3))
    own = {f"http://{TESTCLIENT_HOST}", f"https://{TESTCLIENT_HOST}"}
    with TestClient(create_app(app_settings(data_dir=tmp_path, max_runs=10_000))) as client:
        taken: list[str] = []

        @settings(max_examples=150, deadline=None,
                  suppress_health_check=[HealthCheck.too_slow])
        @given(ORIGINS, st.sampled_from(["text/plain", "application/x-ndjson"]))
        def check(origin: str, ctype: str) -> None:
            try:
                origin.encode("ascii")
            except UnicodeEncodeError:
                return
            r = client.post("/api/runs/import", content=log,
                            headers={"origin": origin, "content-type": ctype})
            if origin in own:
                assert r.status_code == 201, (origin, r.text)
                taken.append(r.json()["run"])
            else:
                assert r.status_code == 403, (origin, r.status_code)
                d = client.delete(f"/api/runs/{first}", headers={"origin": origin})
                assert d.status_code == 403, (origin, d.status_code)

        first = client.post("/api/runs/import", content=log, headers={
            "content-type": "application/x-ndjson"}).json()["run"]
        check()
        runs = {r["id"] for r in client.get("/api/runs").json()["runs"]}
        assert runs == {first, *taken}


OWNER_KEY, OTHER_KEY = "owner-" + "k" * 26, "other-" + "o" * 26
WRITES = st.lists(st.tuples(st.sampled_from(["owner", "keyless", "other key"]),
                            st.sets(st.integers(1, 42), min_size=1, max_size=8)),
                  min_size=1, max_size=8)


def contiguous(seqs: set[int]) -> int:
    n = -1
    while n + 1 in seqs:
        n += 1
    return n


def test_fuzzed_writers_and_gaps_ack_only_the_owners_contiguous_prefix(
        tmp_path: Path) -> None:
    recs = synth.records(steps=40)  # seqs 0-42
    runs = iter(range(10**6))
    with TestClient(create_app(app_settings(data_dir=tmp_path, max_runs=10**6))) as client:

        def frame(run: str, seqs: set[int]) -> str:
            return IngestBatch(run=run, records=[recs[i] for i in sorted(seqs)]
                               ).model_dump_json()

        @settings(max_examples=40, deadline=None,
                  suppress_health_check=[HealthCheck.too_slow])
        @given(WRITES)
        def check(writes: list[tuple[str, set[int]]]) -> None:
            run = f"fz{next(runs)}"
            header = recs[0].model_copy(update={"run": run})
            stored = {0}
            with client.websocket_connect("/ws/ingest") as owner:
                owner.send_text(Hello(run=run, key=OWNER_KEY).model_dump_json())
                assert owner.receive_json()["seq"] == -1
                owner.send_text(IngestBatch(run=run, records=[header]).model_dump_json())
                assert owner.receive_json()["seq"] == 0
                for who, seqs in writes:
                    if who == "owner":
                        owner.send_text(frame(run, seqs))
                        stored |= seqs
                        assert owner.receive_json()["seq"] == contiguous(stored)
                        continue
                    with client.websocket_connect("/ws/ingest") as ws:
                        ws.send_text(Hello(run=run, key=None if who == "keyless"
                                           else OTHER_KEY).model_dump_json(exclude_none=True))
                        ws.send_text(frame(run, seqs))
                        try:
                            answer = ws.receive_json()
                        except WebSocketDisconnect as e:
                            assert e.code == 4403, (e.code, e.reason)
                        else:
                            raise AssertionError(f"a stranger was answered: {answer}")
                owner.send_text(Hello(run=run, key=OWNER_KEY).model_dump_json())
                assert owner.receive_json()["seq"] == contiguous(stored)
            steps = client.get(f"/api/runs/{run}/steps?max_points=100000").json()["step"]
            assert steps == sorted(i - 2 for i in stored if 2 <= i <= 41)

        check()
