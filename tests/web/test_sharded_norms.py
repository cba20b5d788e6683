"""A sharded run (two ranks, FSDP2-like and tensor-parallel optimizers) on the dashboard: its
‖grad‖, fresh and drift lines are the model's by default, and the norms control shows each
rank's shards, in the URL too."""

from __future__ import annotations

from typing import Any

import pytest

from tests.server import sharded_synth as sh
from tests.serverproc import ServerProc

from .conftest import ARTIFACTS, Page
from .dash import READ_TRACES, ingest, wait_for

pytestmark = pytest.mark.browser


async def _lines(page: Page, field: str) -> dict[tuple[int, str], list[Any]]:
    traces = await page.evaluate(READ_TRACES, ["chart", field])
    return {(t["rank"], t["opt"]): t["y"] for t in traces}


def _want(run: sh.ShardedRun, rank: int, opt: str, k: int, model: bool) -> list[Any]:
    out: list[Any] = []
    for i in range(sh.STEPS):
        if opt == "AdamW#0" and i == sh.STEPS - 1:
            if rank == 0:  # rank 1 never sent it: no model value, its own as stored
                out.append(None if model else run.own[(0, opt, i)][k])
            continue
        if model and opt != "Adam#2":
            out.append(run.model[(opt, i)][k])
        else:
            out.append(run.own[(rank, opt, i)][k])
    return out


def _same(got: list[Any], want: list[Any]) -> bool:
    return len(got) == len(want) and all(
        (g is None) == (w is None) and (w is None or abs(g - w) <= 1e-9 * abs(w))
        for g, w in zip(got, want, strict=True))


async def test_sharded_norms_are_the_models_and_each_ranks_on_request(
        server: ServerProc, page: Page) -> None:
    run = sh.sharded_run()
    for rank, recs in run.records.items():
        await ingest(server.ws, sh.RUN, recs, rank)
    await page.goto(f"{server.http}/?run={sh.RUN}")
    await page.wait_for_function("document.body.dataset.snapshot >= 1")
    sel = page.locator("#sel-norms")
    assert await sel.is_visible() and await sel.input_value() == "model"
    for field, k in (("norm", 0), ("fresh_norm", 1), ("drift", 2)):
        lines = await _lines(page, field)
        for rank in range(sh.WORLD):
            for opt in sh.OPTIMIZERS:
                assert _same(lines[(rank, opt)], _want(run, rank, opt, k, True)), (
                    field, rank, opt)
    await page.screenshot(path=str(ARTIFACTS / "web-sharded-model.png"))

    await sel.select_option("rank")
    await page.wait_for_function("document.body.dataset.snapshot >= 2")

    async def per_rank() -> bool:
        lines = await _lines(page, "norm")
        return all(_same(lines.get((r, o), []), _want(run, r, o, 0, False))
                   for r in range(sh.WORLD) for o in sh.OPTIMIZERS)

    assert await wait_for(per_rank)
    assert "norms=rank" in page.url
    await page.reload()
    await page.wait_for_function("document.body.dataset.snapshot >= 1")
    assert await sel.input_value() == "rank" and await per_rank()
    await page.screenshot(path=str(ARTIFACTS / "web-sharded-ranks.png"))
    assert page.errors == []
