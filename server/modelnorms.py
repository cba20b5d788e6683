"""The model's gradient norms of a sharded run, read from its ranks' stored rows.

Under FSDP2 or tensor parallel each rank records the norms of its own shards; the ranks of
one ``torchrun`` launch stream into one run, one (rank, optimizer) series each. Here, at read
time and above the storage layer (only :class:`~server.reader.Reader`'s public reads), the
rows of an optimizer with sharded parameters get the model's ``norm``, ``fresh_norm`` and
``drift`` at each step, combined by the one rule of :class:`gradwatch.shardnorms.ModelNorms`
(square root of the sum of the ranks' squares for a sharded parameter, anything else counted
once). Every other column (finding facts, resets, loss) stays the rank's own; ``norms="rank"``
reads the ranks' own values as stored. Called from worker threads; plain module: no FastAPI.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from gradwatch.server.downsampling import downsample
from gradwatch.server.rows import Row, SeriesRows
from gradwatch.shardnorms import Combined, ModelNorms, all_sharded, sharded

if TYPE_CHECKING:
    from gradwatch.server.reader import Reader

Norms = Literal["model", "rank"]
"""What a read's ``norms`` may ask for: the model's norms (default) or each rank's own."""

READ_CAP = 20_000
"""Rows per (rank, optimizer) read to combine one window: up to it every rank's rows of
every step are at hand; a longer window is read downsampled, and a step some rank's read
left out shows no model value (a narrower window shows it)."""


@dataclass
class Plan:
    """Which optimizers of a run are combined, and how.

    Attributes:
        world: the launch's ranks (the header's ``world_size``).
        live: more rows may come: the run is live, or interrupted (a stream that resumes
            makes it live again).
        kinds: per combined optimizer, each rank's placement kinds.
    """

    world: int
    live: bool = False
    kinds: dict[str, dict[int, str]] = field(default_factory=dict)

    def rowwise(self, opt: str) -> bool:
        """Every parameter sharded on every rank: the rows' norms combine, no
        per-parameter read needed (:func:`gradwatch.shardnorms.all_sharded`)."""
        return all(all_sharded(k) for k in self.kinds[opt].values())


def plan_of(reader: Reader, run_id: str) -> Plan | None:
    """The run's combining plan; None when there is no such run (a run without sharded
    parameters may read as one combining nothing)."""
    kinds: dict[str, dict[int, str]] = {}
    for o in reader.optimizers(run_id):
        if o.placements is not None and sharded(o.placements):
            kinds.setdefault(o.opt, {})[o.rank] = o.placements
    if not kinds:  # the common case: nothing to combine, no header read
        return Plan(world=1)
    run = reader.run(run_id)
    if run is None:
        return None
    world = int(run["header"].get("world_size") or 1)
    return Plan(world=world, live=run["status"] in ("live", "interrupted"),
                kinds=kinds if world > 1 else {})


def combine(reader: Reader, run_id: str, plan: Plan, opt: str, rows: list[Row],
            lo: int, hi: int) -> dict[int, Combined]:
    """The model's norms of ``opt`` at each step every rank has reported, from the rows of
    every rank (``rows``), reading per-parameter norms in [lo, hi] when some parameter is
    not sharded."""
    model = ModelNorms(plan.world)
    out: dict[int, Combined] = {}
    if plan.rowwise(opt):
        for r in range(plan.world):
            model.placements(r, opt, "s")  # a rank's whole norm as one sharded part
        for row in rows:
            if row.norm is not None:  # not sampled on this rank: the step stays unknown
                c = model.add(opt, row.step, row.rank, [row.norm], [row.fresh_norm])
                if c is not None:
                    out[c.step] = c
        return out
    for rank, kinds in plan.kinds[opt].items():
        model.placements(rank, opt, kinds)
        ps = reader.params(run_id, opt, rank, lo, hi, READ_CAP)
        if ps is None:
            continue
        for step, norms, fresh in zip(ps.step, ps.norm, ps.fresh_norm, strict=True):
            c = model.add(opt, step, rank, norms, fresh or None)
            if c is not None:
                out[c.step] = c
    return out


def with_model(rows: list[Row], model: dict[int, Combined]) -> list[Row]:
    """``rows`` with the model's norms at their steps (None where not every rank reported)."""
    out = []
    make = Row._make  # a row per step: cheaper than _replace
    for r in rows:
        c = model.get(r.step)
        vals = (None, None, None) if c is None else (c.norm, c.fresh_norm, c.drift)
        out.append(make((*r[:4], *vals, *r[7:])))
    return out


def model_steps(reader: Reader, run_id: str, start: int | None = None,
                end: int | None = None, max_points: int = 4000, opt: str | None = None,
                rank: int | None = None, last: dict[tuple[int, str], int] | None = None,
                plan: Plan | None = None) -> SeriesRows | None:
    """:meth:`Reader.steps` with the model's norms in the rows of sharded optimizers.

    Args:
        last: as :meth:`Reader.steps`; given (a snapshot) while more rows may come
            (:attr:`Plan.live`), a combined optimizer's rows past the last step every rank
            has stored are left out and its ``last`` is that step: they come live once every
            rank has it (a window read without ``last`` has them).
        plan: the run's plan, if already read.
    Returns:
        The rows (``None``: no such run).
    """
    plan = plan or plan_of(reader, run_id)
    if plan is None:
        return None
    combined = [o for o in plan.kinds if opt is None or o == opt]
    every_opt = {o.opt for o in reader.optimizers(run_id)} if opt is None else {opt}
    base = None
    if not combined or not every_opt <= set(combined):
        base = reader.steps(run_id, start, end, max_points, opt, rank, last)
        if base is None or not combined:
            return base
    # else every optimizer asked for is sharded: the reads below are all it needs
    lo, hi = (-1 if start is None else start), (1 << 62 if end is None else end)
    rows = [] if base is None else [r for r in base.rows if r.opt not in combined]
    bucket, total = (1, 0) if base is None else (base.bucket, base.total)
    for o in combined:
        every = reader.steps(run_id, start, end, READ_CAP, o, None)
        if every is None:
            return None
        model = combine(reader, run_id, plan, o, every.rows, lo, hi)
        mine = [r for r in every.rows if rank is None or r.rank == rank]
        if base is None:  # rows before downsampling: all read, or the read's count
            total += every.total if every.downsampled else len(mine)
            if last is not None:
                for r in every.rows:
                    last[(r.rank, o)] = max(last.get((r.rank, o), -1), r.step)
        if last is not None and plan.live:
            tops = [last.get((r, o), -1) for r in range(plan.world)]
            cut = min(tops)
            mine = [r for r in mine if r.step <= cut]
            last.update({(r, o): cut for r in range(plan.world) if (r, o) in last})
        kept, b = downsample(with_model(mine, model), max_points)
        rows += kept
        bucket = max(bucket, b)
    rows.sort(key=lambda r: (r.rank, r.opt, r.step))
    return SeriesRows(rows, bucket, bucket > 1, total)
