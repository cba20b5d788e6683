"""The two lifecycle findings: gradients no optimizer applies (``untrained_params``), an
optimizer with no gradient to apply (``idle_optimizer``).

Every gradient is produced by a backward, applied by a step, then reset; the four reset kinds
judge the last two links, these two the first. They come from two records the probe sends
when something is missing (:class:`~gradwatch.wire.Unowned`, :class:`~gradwatch.wire.Holding`);
the last record of each holds, so a later one may withdraw a finding. Messages tell the
likely cause apart from what the two records say together: an optimizer holding parameters of
the same shapes that never had a gradient (a module replaced after the optimizer was built),
an optimizer none of whose parameters ever had one (built over another copy of the model), or
neither (parameters left out of the optimizer).

Imports neither torch nor fastapi (used by :class:`~gradwatch.verdict.Verdict`).
"""

from __future__ import annotations

from collections import Counter

from gradwatch.wire import Finding, Holding, OptimizerInfo, Unowned, param_names

UNOWNED = "(no optimizer)"
"""The ``optimizer`` of an ``untrained_params`` finding: no optimizer holds them."""
UNTRAINED_FIX = (
    "If they should train, add them to the optimizer "
    "(optimizer.add_param_group({'params': [...]})); if they are frozen on purpose, call "
    "requires_grad_(False) on them (e.g. model.backbone.requires_grad_(False)) so that "
    "backward() stops computing their gradients.")
"""The fix of ``untrained_params`` parameters left out of the optimizer (the general one)."""
IDLE_FIX = (
    "Build the optimizer over the parameters the loss uses, after any wrapping, copying or "
    "re-creating of the model: model = wrap(model); then "
    "optimizer = torch.optim.AdamW(model.parameters()).")
"""The fix of ``idle_optimizer``."""

Stream = tuple[int, int | None]
"""Whose records: ``(rank, worker)`` (as in :mod:`gradwatch.verdict`)."""


def _listed(names: list[str], count: int) -> str:
    shown = ", ".join(names[:4])
    return shown + (f", ... ({count} in all)" if count > 4 else "")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


class Lifecycle:
    """Incrementally judges the lifecycle kinds of one run, rank by rank."""

    def __init__(self) -> None:
        self._infos: dict[tuple[Stream, str], OptimizerInfo] = {}
        self._holding: dict[tuple[Stream, str], Holding] = {}
        self._unowned: dict[Stream, Unowned] = {}
        self._steps: dict[tuple[Stream, str], tuple[int, int]] = {}
        """``(stream, opt)`` -> steps seen and the last step's index."""

    def optimizer(self, info: OptimizerInfo, stream: Stream) -> None:
        """An optimizer's parameters (names, shapes, label)."""
        self._infos[(stream, info.opt)] = info

    def step(self, stream: Stream, opt: str, step: int) -> None:
        """A step of ``opt`` (counted for the idle span)."""
        n, last = self._steps.get((stream, opt), (0, 0))
        self._steps[(stream, opt)] = (n + 1, max(last, step))

    def feed(self, record: Unowned | Holding, stream: Stream) -> list[Finding]:
        """Take an :class:`Unowned` or :class:`Holding` record; the stream's lifecycle
        findings as they are now (a withdrawn one is absent)."""
        if isinstance(record, Unowned):
            self._unowned[stream] = record
        else:
            self._holding[(stream, record.opt)] = record
        return [f for f in self.findings() if (f.rank, f.worker) == stream]

    def findings(self) -> list[Finding]:
        """Every lifecycle finding as the records seen so far make it."""
        out = []
        for (stream, opt), h in self._holding.items():
            if self._idle(h):
                out.append(self._idle_finding(stream, opt, h))
        for stream, u in self._unowned.items():
            if u.count:
                out.append(self._untrained_finding(stream, u))
        return out

    # ---------------------------------------------------------------- idle_optimizer
    @staticmethod
    def _idle(h: Holding) -> bool:
        return h.step >= 1 and h.requiring > 0 and not h.held

    def _idle_finding(self, stream: Stream, key: str, h: Holding) -> Finding:
        n, last = self._steps.get((stream, key), (h.step + 1, h.step))
        names = self._names(stream, key, h.never)
        opt = self._label(stream, key)
        u = self._unowned.get(stream)
        if u is not None and u.count:
            cause = (f" Meanwhile {_plural(u.count, 'parameter')} that no optimizer holds "
                     f"receive the gradients ({_listed(u.params, u.count)}): {opt} was most "
                     f"likely built over another copy of the model, or before the model was "
                     f"wrapped or re-created.")
        else:
            cause = (f" It was most likely built over a copy of the model, or over "
                     f"parameters the loss no longer reaches (a model wrapped or re-created "
                     f"after {opt} was built).")
        return Finding(
            kind="idle_optimizer", optimizer=opt, first_step=0, last_step=max(last, h.step),
            steps=max(n, h.step + 1), params=names, rank=stream[0], worker=stream[1],
            message=(f"{opt} stepped {_plural(max(n, h.step + 1), 'time')}, but none of its "
                     f"{_plural(h.requiring, 'parameter')} that require grad has ever held a "
                     f"gradient: no loss reaches them, so its steps change nothing.{cause}"),
            fix=IDLE_FIX)

    # ---------------------------------------------------------------- untrained_params
    def _untrained_finding(self, stream: Stream, u: Unowned) -> Finding:
        who = f"{_plural(u.count, 'parameter')} ({_listed(u.params, u.count)}; " \
              f"{u.numel:,} element{'' if u.numel == 1 else 's'})"
        seen = (f"received gradients in {u.backwards} sampled backward "
                f"pass{'' if u.backwards == 1 else 'es'}"
                if u.backwards else "receive gradients")
        replaced, idle = self._suspects(stream, u)
        if idle is not None:
            message = (f"{who} {seen}, but no optimizer holds them, while {idle} steps over "
                       f"parameters that never get a gradient: {idle} was most likely built "
                       f"over another copy of the model, or before the model was wrapped or "
                       f"re-created. These parameters never train.")
            fix = ("Build the optimizer from the model the loss uses, after wrapping or "
                   "copying it: model = wrap(model); then "
                   "optimizer = torch.optim.AdamW(model.parameters()).")
        elif replaced is not None:
            opt, k = replaced
            message = (f"{who} {seen}, but no optimizer holds them; {opt} holds "
                       f"{_plural(k, 'parameter')} of the same shapes that never had a "
                       f"gradient. The module was most likely replaced after {opt} was built: "
                       f"{opt} keeps the old one and the new one never trains.")
            fix = (f"Build {opt} after replacing the module, or hand it the new parameters: "
                   f"optimizer.add_param_group({{'params': model.head.parameters()}}) "
                   f"(with your module for model.head).")
        else:
            message = (f"{who} {seen}, but no optimizer holds them and nothing updates them: "
                       f"they never train, and the backward computes their gradients for "
                       f"nothing.")
            fix = UNTRAINED_FIX
        return Finding(kind="untrained_params", optimizer=UNOWNED, first_step=u.first_step,
                       last_step=u.step, steps=u.step - u.first_step + 1, params=u.params,
                       message=message, fix=fix, rank=stream[0], worker=stream[1])

    def _suspects(self, stream: Stream, u: Unowned
                  ) -> tuple[tuple[str, int] | None, str | None]:
        """``((opt, k), idle opt)``: an optimizer holding ``k`` parameters that never had a
        gradient, of shapes among the untrained ones; an idle optimizer of the stream (by
        display name)."""
        wanted = Counter(tuple(s) for s in u.shapes)
        replaced: tuple[str, int] | None = None
        idle: str | None = None
        for (s, key), h in self._holding.items():
            if s != stream:
                continue
            if self._idle(h) and idle is None:
                idle = self._label(stream, key)
            info = self._infos.get((stream, key))
            if info is None or info.manual:
                continue
            shapes = Counter(tuple(info.shapes[k]) for k in h.never if k < len(info.shapes))
            k = sum((shapes & wanted).values())
            if k and (replaced is None or k > replaced[1]):
                replaced = (self._label(stream, key), k)
        return replaced, idle

    def _label(self, stream: Stream, key: str) -> str:
        info = self._infos.get((stream, key))
        return (info.label or key) if info is not None else key

    def _names(self, stream: Stream, key: str, ks: list[int]) -> list[str]:
        info = self._infos.get((stream, key)) or self._infos.get(((0, None), key))
        names = info.params if info is not None else []
        return param_names(names, ks)
