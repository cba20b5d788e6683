"""Findings from step records: the facts the probe judged, grouped into findings and a summary.

The probe records, per optimizer step, the facts it observed on ``.grad`` (stale, leaked,
late and discarded contributions). This module turns those facts into findings, grouped by
(stream, optimizer, kind), with a message and a fix; a stream is a rank, or a worker process
of one. Findings name optimizers by their display names (``OptimizerInfo.label``). It
imports neither torch nor fastapi, so ``gradwatch check``, the server and the probe's exit
verdict can never disagree.

Each finding names the lines involved (``where``), from the ``Site`` records its steps refer
to, the line to change first: ``late_reset`` the reset, then the backward and the step;
``missed_reset`` the reset in the wrong place if there is one (``zero_grad()`` once per
epoch), the loop's own backward and the backwards whose gradients it re-applied, then the
step;
``discarded_accumulation`` the reset that threw contributions away;
``cross_optimizer_leak`` the backward whose contributions leaked, then the step.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gradwatch.fixes import explain, fix_of
from gradwatch.lifecycle import Lifecycle
from gradwatch.shardnorms import ModelNorms
from gradwatch.wire import (
    End,
    Finding,
    FindingKind,
    Header,
    Holding,
    OptimizerInfo,
    Site,
    Stats,
    Step,
    Unowned,
    Where,
    param_names,
)

_MAX_WHERE = 12
"""Lines a finding names at most."""

if TYPE_CHECKING:
    from gradwatch.steplog import LogReader, StepLog

FINDING_FACTS: tuple[str, ...] = ("stale", "leaked", "late", "discarded")
"""The per-step counts findings are made of, by name (``late`` counts ``Step.late_params``).

The server's step rows and ``steps`` table use these names for the same counts.
"""

def fact_counts(step: Step) -> tuple[int, int, int, int]:
    """A step's :data:`FINDING_FACTS` counts, in that order."""
    return step.stale, step.leaked, len(step.late_params), step.discarded


def carries_facts(counts: Iterable[int]) -> bool:
    """Whether :data:`FINDING_FACTS` counts (never negative) hold a finding fact.

    The one rule for "this step can become a finding": a step without one never changes
    any finding, so the server feeds the :class:`Verdict` only steps with one.
    """
    return any(counts)


def has_finding_facts(step: Step) -> bool:
    """Whether a step carries a finding fact (:func:`carries_facts` of its counts)."""
    return carries_facts(fact_counts(step))


Stream = tuple[int, int | None]
"""Whose records: ``(rank, worker)``; ``worker`` is None outside worker processes."""


@dataclass
class _Group:
    kind: FindingKind
    opt: str
    stream: Stream
    first_step: int
    last_step: int
    steps: int = 0
    params: dict[int, None] = field(default_factory=dict)  # ordered set of indices
    where: dict[tuple[str, int], None] = field(default_factory=dict)
    """Ordered set of ``(role, site id)``."""
    counts: dict[str, int] = field(default_factory=lambda: {"stale": 0, "leaked": 0,
                                                             "discarded": 0, "late": 0})
    worst_step: int = 0
    """missed_reset: the step that read the most contributions, and what it read."""
    worst_consumed: int = 0
    worst_fresh: int = 0
    worst_backwards: int = 0
    reset_how: str | None = None
    """late_reset, discarded_accumulation: how the first offending reset was done."""


@dataclass
class _StreamState:
    steps: int = 0
    status: str | None = None
    exit_code: int | None = None
    disabled: str | None = None
    """Why the probe turned itself off in this stream (``Stats.disabled``)."""
    stopped_at: tuple[str | None, int] | None = None
    """``(optimizer, step)``: the last step judged before it did."""
    last: tuple[str, int] | None = None
    """The latest step record read (where an older log's stop is placed)."""


class Verdict:
    """Incrementally turns records into findings.

    Feed records of any number of streams (ranks, and worker processes of a rank) in any
    interleaving, each stream in its own order; read :meth:`findings` and :meth:`summary`
    at any time.
    """

    def __init__(self, combine: bool = False) -> None:
        """``combine``: also combine a sharded run's norms across its ranks
        (:class:`~gradwatch.shardnorms.ModelNorms`; every step of every rank must be fed)."""
        self._combine = combine
        self._model: ModelNorms | None = None
        self._params: dict[tuple[Stream, str], list[str]] = {}
        self._labels: dict[tuple[Stream, str], str] = {}
        self._sites: dict[tuple[Stream, int], Site] = {}
        self._groups: dict[tuple[Stream, str, str], _Group] = {}
        self._streams: dict[Stream, _StreamState] = {}
        self._skipped = 0
        self._dropped: dict[Stream, int] = {}
        self._header: Header | None = None
        self._max_drift: float | None = None
        self._life = Lifecycle()
        self._manual: set[tuple[Stream, str]] = set()
        """The virtual optimizers (updates by hand) of each stream."""
        self._manual_steps = 0

    def feed(self, record: Any, rank: int = 0, worker: int | None = None) -> list[Finding]:
        """Take one record of stream ``(rank, worker)``; return the findings it created or
        changed."""
        stream = (rank, worker)
        state = self._streams.get(stream)
        if state is None:
            state = self._streams[stream] = _StreamState()
        if isinstance(record, Header):
            self._header = self._header or record
        elif isinstance(record, OptimizerInfo):
            if record.placements and self._combine and worker is None:
                if self._model is None:
                    world = self._header.world_size if self._header else rank + 1
                    self._model = ModelNorms(world)
                self._model.feed(record, rank)
            self._params[(stream, record.opt)] = record.params
            if record.label:
                self._labels[(stream, record.opt)] = record.label
            self._life.optimizer(record, stream)
            if record.manual:
                self._manual.add((stream, record.opt))
        elif isinstance(record, (Unowned, Holding)):
            return self._life.feed(record, stream)
        elif isinstance(record, Site):
            self._sites[(stream, record.id)] = record
        elif isinstance(record, (Stats, End)):
            self._dropped[stream] = max(self._dropped.get(stream, 0), record.dropped)
            if isinstance(record, End):
                state.status, state.exit_code = record.status, record.exit_code
            elif record.disabled and state.disabled is None:
                state.disabled = record.disabled
                if record.last_step is not None:
                    state.stopped_at = (record.last_opt, record.last_step)
                elif state.last is not None:  # a version-3 log: its latest step read
                    state.stopped_at = state.last
        elif isinstance(record, Step):
            state.steps += 1
            state.last = (record.opt, record.step)
            if self._model is not None and worker is None:
                self._model.feed(record, rank)
            return self._feed_step(record, stream)
        return []

    def _feed_step(self, s: Step, stream: Stream) -> list[Finding]:
        self._skipped += s.skipped
        self._life.step(stream, s.opt, s.step)
        if self._manual and (stream, s.opt) in self._manual:
            self._manual_steps += 1
        if s.drift is not None and s.drift == s.drift:  # NaN never compares equal
            self._max_drift = s.drift if self._max_drift is None else max(
                self._max_drift, s.drift)
        if not has_finding_facts(s):
            return []
        hits: list[tuple[FindingKind, list[int], str, int]] = []
        if s.stale:
            hits.append(("missed_reset", s.stale_params, "stale", s.stale))
        if s.leaked:
            hits.append(("cross_optimizer_leak", s.leaked_params, "leaked", s.leaked))
        if s.late_params:
            hits.append(("late_reset", s.late_params, "late", len(s.late_params)))
        if s.discarded:
            hits.append(("discarded_accumulation", s.discarded_params, "discarded",
                         s.discarded))
        changed = []
        for kind, params, counter, n in hits:
            key = (stream, s.opt, kind)
            g = self._groups.get(key)
            if g is None:
                g = self._groups[key] = _Group(kind, s.opt, stream, s.step, s.step)
            g.steps += 1
            g.first_step = min(g.first_step, s.step)
            g.last_step = max(g.last_step, s.step)
            g.counts[counter] += n
            if kind == "missed_reset" and s.consumed > g.worst_consumed:
                g.worst_step, g.worst_consumed, g.worst_fresh = s.step, s.consumed, s.fresh
                g.worst_backwards = s.backwards
            if g.reset_how is None and kind in ("late_reset", "discarded_accumulation"):
                g.reset_how = next((r.how for r in s.resets if (
                    r.after_backward if kind == "late_reset" else r.discarded)), None)
            for i in params:
                g.params.setdefault(i, None)
            for place in _places(kind, s):
                if len(g.where) >= _MAX_WHERE:
                    break
                g.where.setdefault(place, None)
            changed.append(self._finding(g))
        return changed

    def _finding(self, g: _Group) -> Finding:
        rank, worker = g.stream
        names = self._params.get((g.stream, g.opt)) or self._params.get(
            ((0, None), g.opt)) or []
        params = param_names(names, g.params)
        opt = self._labels.get((g.stream, g.opt), g.opt)
        manual = (g.stream, g.opt) in self._manual
        where = [Where(role=role, file=site.file, line=site.line,  # type: ignore[arg-type]
                       function=site.function)
                 for role, sid in g.where if (site := self._sites.get((g.stream, sid)))
                 and not (manual and role == "step")]  # seen at a boundary, not its line
        message = explain(g.kind, f"{opt} (the updates by hand)" if manual else opt, g.steps,
                          g.first_step, g.counts, (g.worst_step, g.worst_consumed, g.worst_fresh,
                                                   g.worst_backwards))
        fix = fix_of(g.kind, opt, where, g.reset_how, manual)
        return Finding(
            kind=g.kind,
            optimizer=opt,
            first_step=g.first_step,
            last_step=g.last_step,
            steps=g.steps,
            params=params,
            message=message,
            fix=fix,
            rank=rank,
            where=where,
            worker=worker,
        )

    def findings(self) -> list[Finding]:
        """All findings so far, ordered by first step."""
        out = [self._finding(g) for g in self._groups.values()]
        out += self._life.findings()
        return sorted(out, key=lambda f: (f.first_step, f.rank, f.worker or 0, f.optimizer,
                                          f.kind))

    @property
    def steps(self) -> int:
        """Optimizer steps judged, over every stream."""
        return sum(st.steps for st in self._streams.values())

    def nothing_judged(self) -> str | None:
        """Why nothing was judged (no optimizer step in any stream), or None if something
        was. The reason says whether the run failed before its first step."""
        if self.steps:
            return None
        failed = [(stream, st) for stream, st in self._streams.items()
                  if st.status == "failed"]
        if failed:
            stream, st = failed[0]
            code = f" (exit code {st.exit_code})" if st.exit_code is not None else ""
            who = f" ({stream_name(stream)})" if len(self._streams) > 1 else ""
            return f"the run failed before its first optimizer step{who}{code}"
        if any(st.status is None for st in self._streams.values()):
            return ("no optimizer step in the log, and it has no end record: the run was "
                    "killed, or is still running, before its first step")
        return "no optimizer step in the log: the run never stepped an optimizer"

    def stopped(self) -> list[dict[str, Any]]:
        """The streams whose probe turned itself off, judging nothing after that:
        ``rank``, ``worker``, ``opt`` and ``after_step`` (the last step judged, None if
        none), ``cause``; in stream order."""
        out = []
        for (rank, worker), st in sorted(self._streams.items(),
                                         key=lambda x: (x[0][0], x[0][1] or 0)):
            if st.disabled is None:
                continue
            opt, step = st.stopped_at if st.stopped_at is not None else (None, None)
            out.append({"rank": rank, "worker": worker,
                        "opt": self._labels.get(((rank, worker), opt or ""), opt),
                        "after_step": step, "cause": st.disabled})
        return out

    def stopped_text(self) -> str | None:
        """A sentence per stream whose probe turned itself off (see :meth:`stopped`), or
        None: "nothing judged after step N on rank R: the probe turned itself off (cause)"."""
        parts = []
        several = len(self._streams) > 1
        for s in self.stopped():
            who = f" on {stream_name((s['rank'], s['worker']))}" if several else ""
            step = s["after_step"]
            when = (f"nothing judged after step {step}" + (f" of {s['opt']}" if s["opt"]
                                                           else "")
                    if step is not None else "nothing judged")
            parts.append(f"{when}{who}: the probe turned itself off ({s['cause']})")
        return "; ".join(parts) or None

    def summary(self) -> dict[str, Any]:
        """Run-level figures, as ``gradwatch check --json`` prints them."""
        by_kind: dict[str, int] = {}
        for g in self._groups.values():
            by_kind[g.kind] = by_kind.get(g.kind, 0) + 1
        for f in self._life.findings():
            by_kind[f.kind] = by_kind.get(f.kind, 0) + 1
        statuses = {st.status for st in self._streams.values()}
        status = next((s for s in ("failed", "interrupted", "finished") if s in statuses),
                      None)
        return {
            "run": self._header.run if self._header else None,
            "run_name": self._header.run_name if self._header else None,
            "steps": self.steps,
            "manual_steps": self._manual_steps,
            "skipped_steps": self._skipped,
            "optimizers": sorted({self._labels.get(k, k[1]) for k in self._params}),
            "findings": sum(by_kind.values()),
            "by_kind": by_kind,
            "max_drift": self._max_drift,
            "dropped": sum(self._dropped.values()),
            "status": status,
            "nothing_judged": self.nothing_judged(),
            "stopped": self.stopped(),
            "model_norms": self._model.summary() if self._model is not None else None,
            "streams": [{"rank": r, "worker": w, "steps": st.steps, "status": st.status,
                         "exit_code": st.exit_code}
                        for (r, w), st in sorted(self._streams.items(),
                                                 key=lambda x: (x[0][0], x[0][1] or 0))],
        }


def stream_name(stream: Stream) -> str:
    """``rank 1``, ``worker 2`` or ``rank 1 worker 2``."""
    rank, worker = stream
    if worker is None:
        return f"rank {rank}"
    return f"worker {worker}" if rank == 0 else f"rank {rank} worker {worker}"


def _places(kind: str, s: Step) -> list[tuple[str, int]]:
    """The ``(role, site id)`` lines a step gives a finding of ``kind``, the one to change
    first."""
    sites = s.sites
    step = [("step", sites.step)] if sites is not None and sites.step else []
    if kind == "late_reset":
        return ([("reset", r.site) for r in s.resets if r.after_backward and r.site]
                + [("backward", b) for b in (sites.lost if sites else ())] + step)
    if kind == "discarded_accumulation":
        return [("reset", r.site) for r in s.resets if r.discarded and r.site]
    if kind == "missed_reset":  # the reset in the wrong place first, else the loop's own
        # backward (the reset goes before it), then where the old came from, then the step
        reset = [("reset", sites.reset)] if sites is not None and sites.reset else []
        return reset + [("backward", b) for b in (
            [*sites.fresh, *sites.stale] if sites else ())] + step
    return [("backward", b) for b in (sites.leaked if sites else ())] + step


def verdict_of(records: Iterable[Any]) -> Verdict:
    """The verdict of a whole sequence of single-rank records (a step log)."""
    j = Verdict()
    for r in records:
        j.feed(r)
    return j


def verdict_of_logs(logs: Iterable[StepLog | LogReader], combine: bool = False) -> Verdict:
    """The verdict of the step logs of one run's streams together (see
    :func:`gradwatch.steplog.open_run`), each stream tagged by its header's rank and
    worker; a :class:`~gradwatch.steplog.LogReader` is read through once. ``combine``: the
    model's norms of a sharded run too (``summary()["model_norms"]``)."""
    j = Verdict(combine)
    for log in logs:
        h = log.header
        j.feed(h, h.rank, h.worker)
        for r in log.records:
            j.feed(r, h.rank, h.worker)
    return j
