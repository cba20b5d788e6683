"""Findings from step records: the facts the probe judged, grouped into findings and a summary.

The probe records, per optimizer step, the facts it observed on ``.grad`` (stale, leaked,
late and discarded contributions). This module turns those facts into findings, grouped by
(rank, optimizer, kind), with a message and a fix. It imports neither torch nor fastapi, so
``gradwatch check``, the server and the probe's exit verdict can never disagree.

Each finding names the lines involved (``where``), from the ``Site`` records its steps refer
to, the line to change first: ``late_reset`` the reset, then the backward and the step;
``missed_reset`` the step, then the backwards whose gradients it re-applied;
``discarded_accumulation`` the reset that threw contributions away;
``cross_optimizer_leak`` the backward whose contributions leaked, then the step.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gradwatch.wire import End, Finding, Header, OptimizerInfo, Site, Stats, Step, Where

_MAX_WHERE = 12
"""Lines a finding names at most."""

_FIX = {
    "missed_reset": (
        "Clear gradients once per optimizer step: call optimizer.zero_grad() before "
        "loss.backward() (or right after optimizer.step()), for every optimizer and "
        "inside the closure for LBFGS."
    ),
    "cross_optimizer_leak": (
        "Clear this optimizer's gradients before the backward it should step on "
        "(d_opt.zero_grad() right before d_loss.backward()), or keep the other loss "
        "from reaching these parameters (detach() the input, or requires_grad_(False))."
    ),
    "late_reset": (
        "Move zero_grad() out from between loss.backward() and optimizer.step(): reset "
        "before the backward (or after the step), never between them."
    ),
    "discarded_accumulation": (
        "Reset only after the step that closes the accumulation window: "
        "if (i + 1) % accum == 0: optimizer.step(); optimizer.zero_grad()."
    ),
}


def has_finding_facts(step: Step) -> bool:
    """Whether a step carries a fact that becomes a finding.

    The server keeps only such steps as models for the judge; steps without one never
    change findings.
    """
    return bool(step.stale or step.leaked or step.late_params or step.discarded)


def _explain(kind: str, opt: str, n: int, first: int, stats: dict[str, int]) -> str:
    steps = f"{n} step{'s' if n != 1 else ''} from step {first}"
    if kind == "missed_reset":
        piled = stats.get("piled", 0)
        worst = (f"; at worst .grad held {piled} backward passes' worth where 1 was fresh"
                 if piled > 1 else "")
        return (
            f"{opt} re-applied gradients it had already stepped on, over {steps}{worst}, "
            f"so each update repeats old ones ({stats['stale']} stale contributions)."
        )
    if kind == "cross_optimizer_leak":
        return (
            f"{opt} stepped on gradients left by a backward that another optimizer had "
            f"already stepped on: {stats['leaked']} leaked contributions over {steps}."
        )
    if kind == "late_reset":
        return (
            f"{opt} stepped with no fresh gradient: a reset between backward() and step() "
            f"threw it away ({steps}); the optimizer updated on zeros or not at all."
        )
    return (
        f"A reset threw away {stats['discarded']} gradient contributions before {opt} "
        f"stepped on them ({steps}): each step used only part of its accumulation window."
    )


@dataclass
class _Group:
    kind: str
    opt: str
    rank: int
    first_step: int
    last_step: int
    steps: int = 0
    params: dict[int, None] = field(default_factory=dict)  # ordered set of indices
    where: dict[tuple[str, int], None] = field(default_factory=dict)
    """Ordered set of ``(role, site id)``."""
    counts: dict[str, int] = field(default_factory=lambda: {"stale": 0, "leaked": 0,
                                                             "discarded": 0, "late": 0,
                                                             "piled": 0})


class Verdict:
    """Incrementally turns records into findings.

    Feed records in any rank interleaving (each rank in its own order); read
    :meth:`findings` and :meth:`summary` at any time.
    """

    def __init__(self) -> None:
        self._params: dict[tuple[int, str], list[str]] = {}
        self._sites: dict[tuple[int, int], Site] = {}
        self._groups: dict[tuple[int, str, str], _Group] = {}
        self._steps = 0
        self._skipped = 0
        self._dropped: dict[int, int] = {}
        self._status: str | None = None
        self._header: Header | None = None
        self._max_drift: float | None = None

    def feed(self, record: Any, rank: int = 0) -> list[Finding]:
        """Take one record from ``rank``; return the findings it created or changed."""
        if isinstance(record, Header):
            self._header = self._header or record
        elif isinstance(record, OptimizerInfo):
            self._params[(rank, record.opt)] = record.params
        elif isinstance(record, Site):
            self._sites[(rank, record.id)] = record
        elif isinstance(record, (Stats, End)):
            self._dropped[rank] = max(self._dropped.get(rank, 0), record.dropped)
            if isinstance(record, End):
                self._status = record.status
        elif isinstance(record, Step):
            return self._feed_step(record, rank)
        return []

    def _feed_step(self, s: Step, rank: int) -> list[Finding]:
        self._steps += 1
        self._skipped += s.skipped
        if s.drift is not None and s.drift == s.drift:  # NaN never compares equal
            self._max_drift = s.drift if self._max_drift is None else max(
                self._max_drift, s.drift)
        if not has_finding_facts(s):
            return []
        hits: list[tuple[str, list[int], str, int]] = []
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
            key = (rank, s.opt, kind)
            g = self._groups.get(key)
            if g is None:
                g = self._groups[key] = _Group(kind, s.opt, rank, s.step, s.step)
            g.steps += 1
            g.first_step = min(g.first_step, s.step)
            g.last_step = max(g.last_step, s.step)
            g.counts[counter] += n
            if kind == "missed_reset" and s.fresh:
                # consumed/fresh: how many backward passes' worth each gradient carried
                g.counts["piled"] = max(g.counts["piled"], round(s.consumed / s.fresh))
            for i in params:
                g.params.setdefault(i, None)
            for place in _places(kind, s):
                if len(g.where) >= _MAX_WHERE:
                    break
                g.where.setdefault(place, None)
            changed.append(self._finding(g))
        return changed

    def _finding(self, g: _Group) -> Finding:
        names = self._params.get((g.rank, g.opt)) or self._params.get((0, g.opt)) or []
        params = [names[i] if i < len(names) else f"param[{i}]" for i in g.params]
        return Finding(
            kind=g.kind,  # type: ignore[arg-type]
            optimizer=g.opt,
            first_step=g.first_step,
            last_step=g.last_step,
            steps=g.steps,
            params=params,
            message=_explain(g.kind, g.opt, g.steps, g.first_step, g.counts),
            fix=_FIX[g.kind],
            rank=g.rank,
            where=[Where(role=role, file=site.file, line=site.line,  # type: ignore[arg-type]
                         function=site.function)
                   for role, sid in g.where if (site := self._sites.get((g.rank, sid)))],
        )

    def findings(self) -> list[Finding]:
        """All findings so far, ordered by first step."""
        out = [self._finding(g) for g in self._groups.values()]
        return sorted(out, key=lambda f: (f.first_step, f.rank, f.optimizer, f.kind))

    def summary(self) -> dict[str, Any]:
        """Run-level figures for ``check --json`` and the run list."""
        by_kind: dict[str, int] = {}
        for g in self._groups.values():
            by_kind[g.kind] = by_kind.get(g.kind, 0) + 1
        return {
            "run": self._header.run if self._header else None,
            "run_name": self._header.run_name if self._header else None,
            "steps": self._steps,
            "skipped_steps": self._skipped,
            "optimizers": sorted({opt for (_, opt) in self._params}),
            "findings": sum(by_kind.values()),
            "by_kind": by_kind,
            "max_drift": self._max_drift,
            "dropped": sum(self._dropped.values()),
            "status": self._status,
        }


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
    if kind == "missed_reset":
        return step + [("backward", b) for b in (sites.stale if sites else ())]
    return [("backward", b) for b in (sites.leaked if sites else ())] + step


def verdict_of(records: Iterable[Any]) -> Verdict:
    """The verdict of a whole sequence of single-rank records (a step log)."""
    j = Verdict()
    for r in records:
        j.feed(r)
    return j
