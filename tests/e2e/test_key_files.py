"""End to end: a stream key file planted beside a step log (open to others, or a symlink)
is never adopted: the probe streams nothing, says why naming the file, and still writes the
log; its own key file is private and the stream it keys reaches the server."""

from __future__ import annotations

import logging
import stat
import time
from pathlib import Path

import pytest

from tests.serverproc import ServerProc

torch = pytest.importorskip("torch")
import gradwatch  # noqa: E402
from gradwatch.steplog import read_log  # noqa: E402
from gradwatch.streamkey import key_file, own_key  # noqa: E402


def _train(log: Path, server: str, run_id: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with gradwatch.watch(opt, model=model, log=log, server=server, run_id=run_id):
        for _ in range(20):
            opt.zero_grad()
            model(torch.randn(2, 4)).pow(2).mean().backward()
            opt.step()


def test_a_planted_key_file_streams_nothing_and_says_why(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    with ServerProc(tmp_path / "data") as srv:
        planted = shared / "planted.jsonl"
        own_key(tmp_path / "attacker.jsonl")  # a valid key, known to its planter
        key_file(planted).write_text(key_file(tmp_path / "attacker.jsonl").read_text())
        key_file(planted).chmod(0o644)
        linked = shared / "linked.jsonl"
        key_file(linked).symlink_to(tmp_path / "somewhere-else")
        for log, run_id, why in ((planted, "e2e-planted", "is open to other users"),
                                 (linked, "e2e-linked", "is a symlink")):
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="gradwatch"):
                _train(log, srv.ws, run_id)
            said = [r.getMessage() for r in caplog.records if "not streaming" in r.getMessage()]
            assert len(said) == 1 and str(key_file(log)) in said[0] and why in said[0], said
            assert [r.step for r in read_log(log).records if r.type == "step"] == list(range(20))
        assert not (tmp_path / "somewhere-else").exists()

        mine = shared / "mine.jsonl"
        _train(mine, srv.ws, "e2e-mine")
        assert stat.S_IMODE(key_file(mine).stat().st_mode) == 0o600
        deadline = time.monotonic() + 15
        while {r["id"] for r in srv.get("/api/runs")["runs"]} != {"e2e-mine"}:
            assert time.monotonic() < deadline, srv.get("/api/runs")
            time.sleep(0.1)
        time.sleep(0.5)  # nothing of the refused streams arrives late either
        assert {r["id"] for r in srv.get("/api/runs")["runs"]} == {"e2e-mine"}
