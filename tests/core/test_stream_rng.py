"""The streamer runs in the training process: retrying an unreachable server must not draw
from the global ``random`` generator, whose sequence is the user's (data order, augmentation)."""

from __future__ import annotations

import random
import time
from pathlib import Path

from gradwatch.stream import Streamer
from tests.serverproc import free_port


class CountingStreamer(Streamer):
    """Counts the connections it lost or never made (each is followed by a backoff)."""

    failed = 0

    def _lost(self, e: BaseException) -> None:
        self.failed += 1
        super()._lost(e)


def test_retrying_an_unreachable_server_leaves_the_global_random_state_alone(
        tmp_path: Path) -> None:
    random.seed(1234)
    before = random.getstate()
    s = CountingStreamer(f"ws://127.0.0.1:{free_port()}", tmp_path / "spool.jsonl", "rng",
                         max_backoff=0.05)
    s.start()
    try:
        deadline = time.monotonic() + 30
        while s.failed < 4:  # the third backoff has been drawn
            assert time.monotonic() < deadline, s.stats()
            time.sleep(0.02)
    finally:
        s.close(timeout=1)
    assert random.getstate() == before
