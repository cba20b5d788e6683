"""Server benchmark: ingest throughput, step-to-live-client latency, 1M-step queries.

Runs a real ``gradwatch serve`` process on 127.0.0.1 (a temporary data directory) and
prints figures (not pass/fail):

- step records/s ingested *and stored* (acked after commit) from 1 and from 8 concurrent
  ingest connections;
- step-to-live-client latency p50/p99 with 1 and with 50 live clients while 1,000
  steps/s in total stream in (batches of 10 every 10 ms);
- many runs and ranks at once: 8 runs x 4 ranks streaming into one server (32 ingest
  connections), step records/s stored in total and the ack latency p99 (a frame's send to
  its ack), and the step-to-live-client p99 of 50 live clients of another run streaming
  1,000 steps/s meanwhile (``--no-many`` skips it);
- ``GET /api/runs/{id}/steps?max_points=4000`` on a 1,000,000-step run (``--no-million``
  skips building it).

With ``--db postgresql`` (a throwaway cluster, ``tests/pgcluster.py``) or ``--db URL`` (an
empty database), the many-runs figures are measured twice and printed side by side: once
on one SQLite server, once on two ``gradwatch serve --db URL`` processes sharing the
PostgreSQL database, the 32 streams and the 50 live clients split between them.

Targets on a 2-core machine: >= 20,000 step records/s; p99 < 50 ms with 50 clients.
Usage: ``python bench/server_ingest.py [--steps N] [--seconds S] [--no-many]
[--only-many] [--no-million] [--db postgresql|URL]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from websockets.asyncio.client import connect as aconnect
from websockets.sync.client import connect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gradwatch.encoding import as_float32, at_float32_precision  # noqa: E402
from gradwatch.frames import Ack, StepSeries, frame_json  # noqa: E402
from gradwatch.wire import End, Header, IngestBatch, OptimizerInfo, Reset, Step  # noqa: E402
from tests.serverproc import ServerProc  # noqa: E402

NPARAMS = 8


def records(run: str, n: int, t0: float = 1000.0) -> list[Any]:
    """A realistic stream: header, optimizer, ``n`` steps with per-parameter norms, End."""
    out: list[Any] = [
        Header(seq=0, t=t0, run=run, run_name=run, torch_version="2.13.0",
               gradwatch_version="0.1.0", started=t0),
        OptimizerInfo(seq=1, t=t0, opt="AdamW#0", cls="AdamW",
                      params=[f"layer{i}.weight" for i in range(NPARAMS)],
                      shapes=[[64, 64]] * NPARAMS, groups=[0] * NPARAMS)]
    for i in range(n):
        # As the probe records them: per-parameter norms are float32 values (norms of
        # float32 gradients), their total has float32's 9 digits.
        part = as_float32((1.0 + 0.3 * math.sin(i / 50)) / NPARAMS)
        norm = at_float32_precision(math.hypot(*[part] * NPARAMS))
        out.append(Step(seq=i + 2, t=t0 + i * 1e-3, opt="AdamW#0", step=i, backwards=1,
                        consumed=NPARAMS, fresh=NPARAMS,
                        resets=[Reset(how="optimizer_zero_grad", params=list(range(NPARAMS)))],
                        norm=norm, fresh_norm=norm, drift=1.0,
                        param_norms=[part] * NPARAMS,
                        param_fresh_norms=[part] * NPARAMS))
    out.append(End(seq=n + 2, t=t0 + n * 1e-3, steps=n))
    return out


def frames(run: str, n: int, size: int = 1000) -> list[str]:
    """Ingest frames (JSON text) of ``size`` records."""
    recs = records(run, n)
    return [IngestBatch(run=run, records=recs[i:i + size]).model_dump_json()
            for i in range(0, len(recs), size)]


def send_all(url: str, texts: list[str], window: int = 4,
             acks: list[float] | None = None) -> None:
    """Send frames with up to ``window`` unacked, until the last is acked (stored).

    Args:
        acks: if given, gets each frame's seconds from its send to its ack.
    """
    sent: list[float] = []
    with connect(url, compression=None, max_size=None) as ws:
        inflight = 0

        def ack() -> None:
            Ack.model_validate_json(ws.recv())
            if acks is not None:
                acks.append(time.perf_counter() - sent[len(acks_of)])
            acks_of.append(1)

        acks_of: list[int] = []
        for text in texts:
            if inflight >= window:
                ack()
                inflight -= 1
            sent.append(time.perf_counter())
            ws.send(text)
            inflight += 1
        for _ in range(inflight):
            ack()


def stream_frames(run: str, rank: int, world: int, n: int, size: int = 500) -> list[str]:
    """Frames of one rank of a ``world``-rank run."""
    recs = records(run, n)
    recs[0] = recs[0].model_copy(update={"rank": rank, "world_size": world})
    return [IngestBatch(run=run, rank=rank, records=recs[i:i + size]).model_dump_json()
            for i in range(0, len(recs), size)]


def many(srvs: list[ServerProc], runs: int, ranks: int, steps_each: int, seconds: float
         ) -> tuple[float, list[float], list[float]]:
    """``runs`` x ``ranks`` streams at once; records/s stored, ack latencies, and the live
    latencies of 50 clients of another run streaming meanwhile.

    With several servers (one shared database) stream ``i`` goes to server ``i % n``, and
    the live clients are dealt out alike (the live run streams into the first).
    """
    work = {(r, k): stream_frames(f"many{r}", k, ranks, steps_each)
            for r in range(runs) for k in range(ranks)}
    acks: list[list[float]] = [[] for _ in work]
    threads = [threading.Thread(target=send_all,
                                args=(srvs[i % len(srvs)].ws + "/ws/ingest", w, 4, a))
               for i, (w, a) in enumerate(zip(work.values(), acks, strict=True))]
    # The live clients and their run's sender are a process of their own, as browsers are:
    # in this one, 32 sending threads would hold their GIL and time themselves.
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        watcher = pool.submit(live_latencies, srvs[0].ws, 50, seconds, "many-live",
                              [s.ws for s in srvs])
        time.sleep(3.0)  # the process is up, its clients connected and the run streaming
        dt = _run_all(threads)
        live = watcher.result()
    stored = sum(srvs[-1].get(f"/api/runs/many{r}")["steps"] for r in range(runs))
    assert stored == runs * ranks * steps_each, (stored, runs * ranks * steps_each)
    return stored / dt, [x for a in acks for x in a], live


def _run_all(threads: list[threading.Thread]) -> float:
    """Start the threads, wait for them all; the seconds that took."""
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return time.perf_counter() - t


def throughput(srv: ServerProc, conns: int, steps_each: int, tag: str) -> float:
    """Step records/s stored by ``conns`` concurrent ingest connections."""
    work = [frames(f"{tag}-{c}", steps_each) for c in range(conns)]
    threads = [threading.Thread(target=send_all, args=(srv.ws + "/ws/ingest", w))
               for w in work]
    dt = _run_all(threads)
    stored = sum(srv.get(f"/api/runs/{tag}-{c}")["steps"] for c in range(conns))
    assert stored == conns * steps_each, (stored, conns * steps_each)
    return stored / dt


def live_latencies(ws_base: str, clients: int, seconds: float, run: str,
                   live_bases: list[str] | None = None) -> list[float]:
    """:func:`latency` in a process of its own (a module-level function, for a pool)."""
    return asyncio.run(latency(ws_base, clients, seconds, run, live_bases))


async def latency(ws_base: str, clients: int, seconds: float, run: str,
                  live_bases: list[str] | None = None) -> list[float]:
    """Seconds from sending a step to each live client receiving it (``ws_base``: the
    server's ``ws://host:port`` the run streams into; ``live_bases``: the servers the
    clients are dealt out over, default that one)."""
    bases = live_bases or [ws_base]
    rate, per_batch = 1000, 10
    n = int(rate * seconds)
    recs = records(run, n)
    sent_at: dict[int, float] = {}
    lat: list[float] = []
    async with aconnect(ws_base + "/ws/ingest", compression=None) as ing:
        await ing.send(IngestBatch(run=run, records=recs[:2]).model_dump_json())
        await ing.recv()

        async def watch(ws: Any) -> None:
            async for msg in ws:
                now = time.perf_counter()
                m = json.loads(msg)
                if m["type"] == "steps":
                    lat.extend(now - sent_at[s] for s in m["steps"]["step"])

        lives = [await aconnect(bases[c % len(bases)] + f"/ws/live?run={run}",
                                compression=None, max_size=None) for c in range(clients)]
        for ws in lives:
            await ws.recv()  # snapshot
        tasks = [asyncio.create_task(watch(ws)) for ws in lives]

        async def acks() -> None:
            async for _ in ing:
                pass

        ack_task = asyncio.create_task(acks())
        start = time.perf_counter()
        for k, i in enumerate(range(2, n + 2, per_batch)):
            await asyncio.sleep(max(0.0, start + k * per_batch / rate - time.perf_counter()))
            batch = recs[i:i + per_batch]
            now = time.perf_counter()
            for r in batch:
                if r.type == "step":
                    sent_at[r.step] = now
            await ing.send(IngestBatch(run=run, records=batch).model_dump_json())
        deadline = time.perf_counter() + 10
        while len(lat) < n * clients and time.perf_counter() < deadline:
            await asyncio.sleep(0.05)
        for t in tasks:
            t.cancel()
        ack_task.cancel()
        for ws in lives:
            await ws.close()
    return lat


def pct(xs: list[float], q: float) -> float:
    """The ``q`` quantile of ``xs``."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def million(data: Path) -> tuple[float, float, float]:
    """Build a 1M-step run through the storage writer; time the dashboard's queries."""
    from gradwatch.server.batch import batch_of
    from gradwatch.server.reader import Reader
    from gradwatch.server.storage import Store

    store = Store(data)
    t = time.perf_counter()
    recs = records("million", 1_000_000)
    for i in range(0, len(recs), 5000):
        store.ingest(batch_of(IngestBatch(run="million", records=recs[i:i + 5000])))
    build = time.perf_counter() - t
    store.close()
    reader = Reader(data)
    t = time.perf_counter()
    series = reader.steps("million", max_points=4000)
    assert series is not None and series.total == 1_000_000
    frame_json(StepSeries, **series.columns())
    query = time.perf_counter() - t
    t = time.perf_counter()
    params = reader.params("million", "AdamW#0", max_points=500)
    assert params is not None
    params.model_dump_json()
    return build, query, time.perf_counter() - t


SERVE_OPTS = ("--max-msgs-per-sec", "100000", "--max-live-clients", "500")


def many_line(where: str, steps: int, figures: tuple[float, list[float], list[float]]
              ) -> str:
    """The many-runs figures as one line."""
    rate, acks, live = figures
    return (f"8 runs x 4 ranks at once, {where}: {rate:10,.0f} step records/s stored "
            f"({steps // 32 * 32:,} records), ack p50 {pct(acks, .5) * 1e3:.0f} ms "
            f"p99 {pct(acks, .99) * 1e3:.0f} ms; meanwhile 50 live clients: p50 "
            f"{pct(live, .5) * 1e3:.1f} ms p99 {pct(live, .99) * 1e3:.1f} ms")


def many_on_postgres(db: str, tmp: Path, steps: int, seconds: float
                     ) -> tuple[float, list[float], list[float]]:
    """:func:`many` on two servers sharing one PostgreSQL database: ``db`` is an empty
    database's URL, or ``postgresql`` for a throwaway cluster started here."""
    cluster = None
    if db == "postgresql":
        from tests.pgcluster import Cluster
        cluster = Cluster(durable=True)  # flushed as SQLite's server flushes
        db = cluster.new_database()
    try:
        srvs = [ServerProc(tmp / f"pg{i}" / "data", None, "--db", db, *SERVE_OPTS)
                for i in range(2)]
        for srv in srvs:
            srv.data.parent.mkdir()
        with srvs[0], srvs[1]:
            return many(srvs, 8, 4, steps // 32, seconds)
    finally:
        if cluster is not None:
            cluster.stop()


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its figures."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60_000, help="step records per ingest test")
    p.add_argument("--seconds", type=float, default=5.0, help="length of each latency test")
    p.add_argument("--no-million", action="store_true", help="skip the 1M-step query")
    p.add_argument("--no-many", action="store_true", help="skip 8 runs x 4 ranks")
    p.add_argument("--only-many", action="store_true", help="only 8 runs x 4 ranks")
    p.add_argument("--db", default=None, metavar="postgresql|URL",
                   help="also run 8 runs x 4 ranks on two servers sharing a PostgreSQL "
                        "database: a throwaway cluster ('postgresql') or an empty one (URL)")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gradwatch-bench-") as d:
        srv = ServerProc(Path(d) / "data", None, *SERVE_OPTS)
        with srv:
            if not a.no_many:
                figures = many([srv], 8, 4, a.steps // 32, a.seconds * 2)
                print(many_line("SQLite, 1 server", a.steps, figures), flush=True)
        # One at a time: the SQLite server is stopped before the PostgreSQL ones start.
        if a.db is not None and not a.no_many:
            figures = many_on_postgres(a.db, Path(d), a.steps, a.seconds * 2)
            print(many_line("PostgreSQL, 2 servers", a.steps, figures), flush=True)
        if a.only_many:
            return 0
        with srv:
            one = throughput(srv, 1, a.steps, "one")
            print(f"ingest, 1 connection:   {one:10,.0f} step records/s stored "
                  f"({a.steps:,} records)", flush=True)
            eight = throughput(srv, 8, a.steps // 8, "eight")
            print(f"ingest, 8 connections:  {eight:10,.0f} step records/s stored "
                  f"({a.steps // 8 * 8:,} records)", flush=True)
            for clients in (1, 50):
                lat = asyncio.run(latency(srv.ws, clients, a.seconds, f"lat{clients}"))
                got = len(lat) / max(1, int(1000 * a.seconds) * clients)
                print(f"live latency, {clients:2d} client{'s' if clients > 1 else ' '} at "
                      f"1,000 steps/s: p50 {pct(lat, .5) * 1e3:6.1f} ms  p99 "
                      f"{pct(lat, .99) * 1e3:6.1f} ms  (received {got:.1%} of rows)",
                      flush=True)
            with urllib.request.urlopen(srv.http + "/healthz") as r:
                assert json.loads(r.read())["status"] == "ok"
        if not a.no_million:
            build, query, params = million(Path(d) / "million")
            print(f"1,000,000-step run: GET steps?max_points=4000 {query * 1e3:.0f} ms, "
                  f"GET params?max_points=500 {params * 1e3:.0f} ms (built in {build:.0f} s "
                  f"through the storage writer, {1e6 / build:,.0f} records/s)")
    print("targets (2 cores): >= 20,000 step records/s; p99 < 50 ms with 50 live clients")
    return 0


if __name__ == "__main__":
    sys.exit(main())
