"""What a finding says: its message and its fix.

The fix names the user's lines where the finding has them (:func:`gradwatch.locations.located_fix`),
else it is the kind's generic fix (:data:`FIX`); a finding on the virtual optimizer ``manual``
(parameters updated by hand) gets a fix in those words (:data:`MANUAL_FIX`). Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gradwatch.lifecycle import IDLE_FIX, UNTRAINED_FIX
from gradwatch.locations import at, located_fix
from gradwatch.wire import FindingKind, Where

FIX: dict[FindingKind, str] = {
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
    "untrained_params": UNTRAINED_FIX,
    "idle_optimizer": IDLE_FIX,
}
"""Each kind's fix where no line of it is known."""
MANUAL_FIX: dict[str, str] = {
    "missed_reset": (
        "Clear the gradients after each update by hand, before the next loss.backward(): "
        "model.zero_grad() (or p.grad = None / p.grad.zero_() for every parameter you update)."
    ),
    "cross_optimizer_leak": (
        "Clear these parameters' gradients (model.zero_grad()) before the backward they "
        "should be updated on, or keep the other loss from reaching them (detach() the input)."
    ),
    "late_reset": (
        "Update the parameters before clearing their gradients: loss.backward(), then the "
        "update by hand, then model.zero_grad()."
    ),
    "discarded_accumulation": (
        "Clear the gradients only after the update that closes the accumulation window: "
        "if (i + 1) % accum == 0: update by hand; then model.zero_grad()."
    ),
}
"""Fixes for the virtual optimizer ``manual`` (parameters updated by hand, no optimizer)."""


def generic_fix(kind: str) -> str:
    """The fix of a finding kind when no line of it is known ("" for an unknown kind)."""
    return FIX.get(kind, "")  # type: ignore[call-overload]


def fix_of(kind: FindingKind, opt: str, where: Sequence[Where], reset_how: str | None,
           manual: bool) -> str:
    """The fix of a finding of ``kind`` on ``opt`` whose lines are ``where``; ``reset_how``
    is how its first offending reset was done, ``manual`` whether ``opt`` is the virtual
    optimizer of updates by hand."""
    if manual:
        return _manual_fix(kind, where)
    return located_fix(kind, opt, where, reset_how) or FIX[kind]


def explain(kind: FindingKind, opt: str, n: int, first: int, counts: Mapping[str, int],
            worst: tuple[int, int, int, int]) -> str:
    """A finding's message, in backward passes and steps (the user's words, not the probe's
    per-parameter counts): ``opt`` did what over ``n`` steps from step ``first``; for
    ``missed_reset``, the worst step as ``(step, contributions read, of which fresh,
    backward passes since the step before)`` (:data:`~gradwatch.verdict.FINDING_FACTS`
    ``counts`` are not shown: they count (parameter, backward pass) pairs)."""
    steps = f"{n} step{'s' if n != 1 else ''} from step {first}"
    if kind == "missed_reset":
        return (f"{opt} re-applied gradients it had already stepped on, over {steps}: "
                f"nothing cleared them between steps, so each update repeats old ones"
                f"{_worst(*worst)}.")
    if kind == "cross_optimizer_leak":
        return (f"{opt} stepped on gradients left by a backward pass that another optimizer "
                f"had already stepped on, over {steps}.")
    if kind == "late_reset":
        return (
            f"{opt} stepped with no fresh gradient: a reset between backward() and step() "
            f"threw it away ({steps}); the optimizer updated on zeros or not at all."
        )
    return (
        f"A reset threw away gradients of backward passes before {opt} stepped on them "
        f"({steps}): each step used only part of its accumulation window."
    )


def _worst(step: int, consumed: int, fresh: int, backwards: int) -> str:
    """``; step 7 applied the gradients of 60 backward passes; only the last 4 were new``.

    A step reads ``fresh`` contributions from its own ``backwards`` passes, so one pass
    wrote ``fresh / backwards`` of them and the ``consumed`` it read came from
    ``consumed * backwards / fresh`` passes (parameters a pass does not reach make it an
    estimate, bounded by one contribution at least per old pass)."""
    if consumed <= fresh or backwards <= 0:
        return ""
    if fresh <= 0:
        return f"; step {step} applied only gradients of earlier backward passes, none new"
    passes = min(backwards + consumed - fresh,
                 max(backwards + 1, round(consumed * backwards / fresh)))
    new = "only the last one was new" if backwards == 1 else \
        f"only the last {backwards} were new"
    return f"; step {step} applied the gradients of {passes} backward passes; {new}"


def _manual_fix(kind: FindingKind, where: Sequence[Where]) -> str:
    """The fix of a finding on the virtual optimizer ``manual``, naming the backward line
    where one is known (the update by hand itself has no call to name)."""
    fix = MANUAL_FIX[kind]
    b = next((w for w in where if w.role == "backward"), None)
    if kind == "missed_reset" and b is not None:
        return (f"Clear the gradients after each update by hand, before loss.backward() at "
                f"{at(b)}: model.zero_grad() (or p.grad = None / p.grad.zero_() for every "
                f"parameter you update).")
    return fix
