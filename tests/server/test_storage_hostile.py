"""Storage under hostile or unlucky input (issue 21): a step resent under new seq numbers,
a huge step number, a full disk, and a row an older release stored with ``t: NaN``."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import synth
from apps import app_settings
from fastapi.testclient import TestClient

from gradwatch.server import create_app
from gradwatch.server.batch import batch_of
from gradwatch.server.errors import StorageFailed
from gradwatch.server.reader import Reader
from gradwatch.server.storage import Store
from gradwatch.wire import IngestBatch

FIXTURE = Path(__file__).parent / "fixtures" / "release-current.db"


def batch(recs: list[Any], run: str = "run1") -> Any:
    return batch_of(IngestBatch(run=run, rank=0, records=recs))


def test_a_step_resent_under_new_seqs_is_one_step(store: Store, where: Path | str) -> None:
    recs = synth.records(steps=30, end=False)
    store.call(store.ingest, batch(recs))
    # The same steps again, with other norms, under the stream's next seq numbers.
    top = recs[-1].seq
    again = [r.model_copy(update={"seq": top + 1 + k, "norm": 99.0})
             for k, r in enumerate(recs[2:12])]
    res = store.call(store.ingest, batch(again))
    assert res.rows == [] and res.ack == top + 10
    r = Reader(where)
    assert r.summary("run1").steps == 30  # type: ignore[union-attr]
    got = r.steps("run1", max_points=1000)
    assert got is not None and [x.step for x in got.rows] == list(range(30))
    assert 99.0 not in [x.norm for x in got.rows]  # the earlier data stands


def test_a_huge_step_number_costs_nothing(store: Store, where: Path | str) -> None:
    recs = synth.records(steps=200, end=False)
    store.call(store.ingest, batch(recs))
    far = synth.step(len(recs), 10**15)
    t0 = time.perf_counter()
    store.call(store.ingest, batch([far]))
    store.call(store.ingest, batch([synth.step(len(recs) + 1, 10**15 + 5)]))
    got = Reader(where).steps("run1", max_points=100)
    took = time.perf_counter() - t0
    assert got is not None and got.rows[-1].step == 10**15 + 5 and got.total == 202
    assert took < 0.5, took


def test_a_full_disk_refuses_the_batch_and_loses_nothing(sqlite_store: Store, tmp_path: Path
                                                          ) -> None:
    store = sqlite_store  # a SQLite file's page limit stands for the full disk
    recs = synth.records(steps=3000, end=True)
    store.call(store.ingest, batch(recs[:200]))
    pages = store.call(lambda: store._conn.execute("PRAGMA page_count").fetchone()[0])
    store.call(lambda: store._conn.execute(f"PRAGMA max_page_count={pages + 2}"))
    failed_at = None
    for i in range(200, len(recs), 100):
        try:
            store.call(store.ingest, batch(recs[i:i + 100]))
        except StorageFailed as e:
            assert "disk" in e.reason or "full" in e.reason
            failed_at = i
            break
    assert failed_at is not None
    stored = store.call(store.resume_seq, "run1", 0)
    assert stored == failed_at - 1  # memory agrees with the disk: the resend starts there
    r = Reader(tmp_path)
    got = r.steps("run1", max_points=100_000)
    assert got is not None and [x.step for x in got.rows] == list(range(stored - 1))
    store.call(lambda: store._conn.execute("PRAGMA max_page_count=1073741823"))
    for i in range(stored + 1, len(recs), 100):  # space again: the stream resends
        store.call(store.ingest, batch(recs[i:i + 100]))
    got = r.steps("run1", max_points=100_000)
    assert got is not None and [x.step for x in got.rows] == list(range(3000))
    assert r.summary("run1").status == "finished"  # type: ignore[union-attr]


def test_a_row_stored_with_t_nan_by_an_old_release_reads(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    shutil.copyfile(FIXTURE, data / "gradwatch.db")
    with TestClient(create_app(app_settings(data_dir=data))) as client:
        r = client.get("/api/runs/beta/steps")
        assert r.status_code == 200, r.text
        assert len(r.json()["step"]) == 200
        lines = client.get("/api/runs/beta/export").text.splitlines()
        assert len(lines) == 202
        back = client.post("/api/runs/import", content="\n".join(lines) + "\n",
                           headers={"content-type": "application/x-ndjson"})
        assert back.status_code == 201, back.text






@pytest.fixture
def small_fs(tmp_path: Path):
    """A 1 MiB tmpfs the test mounts and removes itself (skipped where it cannot mount)."""
    import subprocess

    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_full_filesystem_refuses_the_batch_and_loses_nothing(small_fs: Path) -> None:
    import subprocess

    recs = synth.records(steps=20_000, end=True)
    s = Store(small_fs / "data")
    s.start()
    failed_at = None
    for i in range(0, len(recs), 500):
        try:
            s.call(s.ingest, batch(recs[i:i + 500]))
        except StorageFailed as e:
            failed_at = i
            assert "full" in e.reason or "disk" in e.reason, e.reason
            break
    assert failed_at is not None, "the filesystem never filled"
    stored = s.call(s.resume_seq, "run1", 0)
    assert stored == failed_at - 1  # memory agrees with the disk
    got = Reader(small_fs / "data").steps("run1", max_points=100_000)
    assert got is not None and [x.step for x in got.rows] == list(range(stored - 1))
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_fs)], check=True)
    for i in range(stored + 1, len(recs), 500):  # room again: the stream resends
        s.call(s.ingest, batch(recs[i:i + 500]))
    s.close()
    r = Reader(small_fs / "data")
    got = r.steps("run1", max_points=100_000)
    assert got is not None and [x.step for x in got.rows] == list(range(20_000))
    assert r.summary("run1").status == "finished"  # type: ignore[union-attr]
    r.close()


class _FullDisk:
    """A connection whose updates of ``runs`` fail as on a full disk."""

    def __init__(self, conn: Any, error: type[Exception]) -> None:
        self.conn, self.error = conn, error

    def execute(self, sql: str, *args: Any) -> Any:
        if sql.startswith("UPDATE runs"):
            raise self.error("database or disk is full")
        return self.conn.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


def test_a_rename_or_an_interruption_on_a_full_disk_changes_nothing(store: Store,
                                                                   where: Path | str) -> None:
    store.call(store.ingest, batch(synth.records(steps=5, end=False)))
    real = store._conn
    store.call(lambda: setattr(store, "_conn", _FullDisk(real, store.database.Error)))
    with pytest.raises(StorageFailed, match="could not rename"):
        store.call(store.rename, "run1", "renamed")
    assert store.call(store.mark_interrupted, "run1") is None
    store.call(lambda: setattr(store, "_conn", real))
    summary = Reader(where).summary("run1")
    assert summary is not None and summary.name != "renamed" and summary.status == "live"
    assert store.call(store.rename, "run1", "renamed").name == "renamed"  # type: ignore[union-attr]
