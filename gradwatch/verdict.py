"""Findings from step records: the facts the probe judged, grouped into findings and a summary.

The probe records, per optimizer step, the facts it observed on ``.grad`` (stale, leaked,
late and discarded contributions). This module turns those facts into findings, grouped by
(rank, optimizer, kind), with a message and a fix. It imports neither torch nor fastapi, so
``gradwatch check``, the server and the probe's exit verdict can never disagree.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gradwatch.wire import End, Finding, FindingKind, Header, OptimizerInfo, Stats, Step

FINDING_FACTS: tuple[str, ...] = ("stale", "leaked", "late", "discarded")
"""The per-step counts findings are made of, by name (``late`` counts ``Step.late_params``).

The server's step rows and ``steps`` table use these names for the same counts.
"""

_FIX: dict[FindingKind, str] = {
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


def unnamed_param(index: int) -> str:
    """The name a finding gives a parameter its optimizer record does not name."""
    return f"param[{index}]"


def _explain(kind: FindingKind, opt: str, n: int, first: int, stats: dict[str, int]) -> str:
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
    kind: FindingKind
    opt: str
    rank: int
    first_step: int
    last_step: int
    steps: int = 0
    params: dict[int, None] = field(default_factory=dict)  # ordered set of indices
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
            changed.append(self._finding(g))
        return changed

    def _finding(self, g: _Group) -> Finding:
        names = self._params.get((g.rank, g.opt)) or self._params.get((0, g.opt)) or []
        params = [names[i] if i < len(names) else unnamed_param(i) for i in g.params]
        return Finding(
            kind=g.kind,
            optimizer=g.opt,
            first_step=g.first_step,
            last_step=g.last_step,
            steps=g.steps,
            params=params,
            message=_explain(g.kind, g.opt, g.steps, g.first_step, g.counts),
            fix=_FIX[g.kind],
            rank=g.rank,
        )

    def findings(self) -> list[Finding]:
        """All findings so far, ordered by first step."""
        out = [self._finding(g) for g in self._groups.values()]
        return sorted(out, key=lambda f: (f.first_step, f.rank, f.optimizer, f.kind))

    def summary(self) -> dict[str, Any]:
        """Run-level figures, as ``gradwatch check --json`` prints them."""
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


def verdict_of(records: Iterable[Any]) -> Verdict:
    """The verdict of a whole sequence of single-rank records (a step log)."""
    j = Verdict()
    for r in records:
        j.feed(r)
    return j
