"""Live step rows in the model's norms, for the dashboards that show them (``norms=model``).

A stored batch's rows go to the clients of each rank's own norms as they are
(:meth:`Runs.publish`); here, for the clients of the model's norms, rows of an optimizer that
is not sharded go on as they are, and those of a sharded one wait until every rank has stored
their step, then are read back combined (:func:`server.modelnorms.model_steps`, in a worker
thread) and sent. When the run ends, the steps some rank never stored are sent too, without
a model value. Runs on the event loop; one task per run at a time. Plain asyncio: no FastAPI.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass, field

from gradwatch.server.batch import IngestResult
from gradwatch.server.fanout import Hub
from gradwatch.server.modelnorms import READ_CAP, Plan, model_steps, plan_of
from gradwatch.server.reader import Reader
from gradwatch.server.rows import Row

log = logging.getLogger(__name__)

MAX_RUNS = 256
"""Runs whose progress is kept (the least recently stored forgotten first)."""


@dataclass
class _Progress:
    plan: Plan | None = None
    top: dict[tuple[int, str], int] = field(default_factory=dict)
    """Highest stored step per (rank, opt)."""
    first: dict[tuple[int, str], int] = field(default_factory=dict)
    """First step seen here per (rank, opt) (after a server restart, not the run's first)."""
    done: dict[str, int] = field(default_factory=dict)
    """Per sharded optimizer, the last step handed on."""
    held: list[Row] = field(default_factory=list)
    """Rows not handed on yet (waiting for the plan)."""
    ended: bool = False
    dirty: bool = False
    """Something came since the task last looked."""
    task: asyncio.Task[None] | None = None


class LiveModel:
    """Hands stored rows on to the clients of the model's norms (see the module doc).

    Args:
        reader: reads the plan and the combined rows.
        hub: the live fan-out the rows go to.
    """

    def __init__(self, reader: Reader, hub: Hub):
        self.reader = reader
        self.hub = hub
        self._runs: OrderedDict[str, _Progress] = OrderedDict()

    def publish(self, res: IngestResult) -> None:
        """A stored batch: its rows go on now or once their step is complete."""
        p = self._runs.get(res.run)
        if p is None:
            p = self._runs[res.run] = _Progress()
            while len(self._runs) > MAX_RUNS:
                self._runs.popitem(last=False)
        self._runs.move_to_end(res.run)
        if res.optimizers:
            p.plan = None  # a new optimizer: its placements are read again
        if res.summary is not None:  # a stream that resumes makes the run live again
            p.ended = res.summary.status != "live"
        busy = p.task is not None and not p.task.done()
        if p.plan is not None and not p.plan.kinds and not busy:
            # nothing sharded: the rows go on as they are, now (the common case)
            self.hub.publish_steps(res.run, res.rows, "model")
            return
        for r in res.rows:
            key = (r.rank, r.opt)
            if r.step > p.top.get(key, -1):
                p.top[key] = r.step
            if key not in p.first:
                p.first[key] = r.step
        p.held += res.rows
        p.dirty = True
        if not busy:
            p.task = asyncio.get_running_loop().create_task(self._work(res.run, p))

    def forget(self, run: str) -> None:
        """The run was deleted."""
        self._runs.pop(run, None)

    async def _work(self, run: str, p: _Progress) -> None:
        try:
            while True:
                if p.plan is None:
                    p.plan = await asyncio.to_thread(plan_of, self.reader, run)
                    if p.plan is None:  # deleted meanwhile
                        self.forget(run)
                        return
                if not await self._hand_on(run, p, p.plan):
                    return
        except Exception:
            log.exception("live model norms of run %s failed; its live rows in the model's "
                          "norms stop until the next batch", run)

    async def _hand_on(self, run: str, p: _Progress, plan: Plan) -> bool:
        """Hand on what is ready; True when more came meanwhile."""
        rows, p.held, p.dirty = p.held, [], False
        watched = self.hub.watched(run, "model")
        plain = [r for r in rows if r.opt not in plan.kinds]
        if plain and watched:
            self.hub.publish_steps(run, plain, "model")
        for opt in plan.kinds:
            if opt not in p.done:
                # from the first step every rank has sent here: a snapshot holds the steps
                # before it (it stops at the last step every rank had stored)
                firsts = [p.first.get((r, opt)) for r in range(plan.world)]
                seen = [f for f in firsts if f is not None]
                if not seen or (len(seen) < len(firsts) and not p.ended):
                    continue
                p.done[opt] = min(seen) - 1
            tops = [p.top.get((r, opt), -1) for r in range(plan.world)]
            hi = max(tops) if p.ended else min(tops)
            lo = p.done[opt] + 1
            if hi < lo:
                continue
            p.done[opt] = hi
            if watched:
                got = await asyncio.to_thread(model_steps, self.reader, run, lo, hi,
                                              READ_CAP, opt, None, None, plan)
                if got is not None:
                    self.hub.publish_steps(run, got.rows, "model")
        return p.dirty or p.plan is None
