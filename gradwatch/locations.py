"""Where a finding is in the user's code: its primary line, paths as people read them, and a
fix that names the lines.

A finding's ``where`` lists the user's calls involved (``role`` backward, reset or step). Each
kind has one *primary* role, the line a code-scanning annotation points at and the one to
edit first:

==========================  =========  ============================================
kind                        primary    why
==========================  =========  ============================================
``late_reset``              reset      the misplaced reset is the line to move
``missed_reset``            reset,     the reset in the wrong place (once per
                            backward   epoch) is the line to move; without one, the
                                       reset goes before the loop's backward
``discarded_accumulation``  reset      the reset threw the window's gradients away
``cross_optimizer_leak``    backward   the backward whose gradients leaked: clear
                                       before it, or keep it off these parameters
==========================  =========  ============================================

Kinds without an entry use the first of step, reset, backward that the finding has.
Torch-free, and never reads the user's files: the server builds findings too.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from gradwatch.wire import Finding, Where

PRIMARY_ROLE: dict[str, tuple[str, ...]] = {
    "late_reset": ("reset",),
    "missed_reset": ("reset", "backward"),
    "discarded_accumulation": ("reset",),
    "cross_optimizer_leak": ("backward",),
}
_FALLBACK_ORDER = ("step", "reset", "backward")

RESET_CALLS = {
    "optimizer_zero_grad": "{opt}.zero_grad()",
    "module_zero_grad": "model.zero_grad()",
    "set_none": "p.grad = None",
    "zero_": "p.grad.zero_()",
}
"""How each kind of reset (a ``Reset.how``) reads in code, for fixes."""


def primary(f: Finding) -> Where | None:
    """The line a finding points at (see the table above), or None without ``where``."""
    for role in (*PRIMARY_ROLE.get(f.kind, ()), *_FALLBACK_ORDER):
        for w in f.where:
            if w.role == role:
                return w
    return f.where[0] if f.where else None


def short_path(file: str, root: str | None = None) -> str:
    """``file`` relative to ``root`` (default: the working directory) when it lies under it,
    else as given."""
    if not os.path.isabs(file):
        return file
    base = root or os.getcwd()
    try:
        rel = os.path.relpath(file, base)
    except ValueError:  # another drive (Windows)
        return file
    return file if rel.startswith(os.pardir) else rel


CELL_PREFIX = "Cell In["
"""How a notebook cell's code is named (``Cell In[3]``, as IPython's tracebacks name it)."""


def at(w: Where) -> str:
    """``train.py:12``; in a notebook, ``Cell In[3], line 4``."""
    if w.file.startswith(CELL_PREFIX):
        return f"{w.file}, line {w.line}"
    return f"{short_path(w.file)}:{w.line}"


def _first(where: Sequence[Where], role: str) -> Where | None:
    return next((w for w in where if w.role == role), None)


def located_fix(kind: str, opt: str, where: Sequence[Where],
                reset_how: str | None = None) -> str | None:
    """A fix that names the lines involved, or None when ``where`` lacks the lines it
    needs (the generic fix then stands).

    Args:
        kind: the finding kind.
        opt: the optimizer's display name.
        where: the finding's lines.
        reset_how: the ``Reset.how`` of the reset involved (late and discarded resets).
    """
    b, r, s = (_first(where, role) for role in ("backward", "reset", "step"))
    reset = RESET_CALLS.get(reset_how or "", "the reset").format(opt=opt)
    step = f"{opt}.step()"
    if kind == "late_reset" and r and b:
        after = f" (or after {step} at {at(s)})" if s else ""
        return (f"Move {reset} at {at(r)} before loss.backward() at {at(b)}{after}: a "
                f"reset between backward() and step() throws the fresh gradient away.")
    if kind == "missed_reset" and r and r.function.endswith(".optimizer_zero_grad"):
        # a framework's reset hook the module overrides (Lightning): Lightning calls it
        # before each step's backward, and the override is what does not reset
        return (f"Make the optimizer_zero_grad hook at {at(r)} clear the gradients "
                f"(optimizer.zero_grad() in it), or remove the override: the framework "
                f"calls it once per step, before the backward, and it resets nothing.")
    if kind == "missed_reset" and r and b:
        after = f" (or right after {step} at {at(s)})" if s else ""
        return (f"Make {opt}.zero_grad() at {at(r)} run once per step, right before "
                f"loss.backward() at {at(b)}{after}: between its calls, steps apply old "
                f"gradients again.")
    if kind == "missed_reset" and (b or s):
        before = f"before loss.backward() at {at(b)}" if b else "before each loss.backward()"
        after = f" (or right after {step} at {at(s)})" if s else ""
        return (f"Call {opt}.zero_grad() {before}{after}, once per step, so that each "
                f"step applies only its own gradients.")
    if kind == "discarded_accumulation" and r:
        after = f"after {step} at {at(s)}" if s else "after the step that closes the window"
        return (f"Move {reset} at {at(r)} {after}, in the same branch: "
                f"if (i + 1) % accum == 0: {step}; {opt}.zero_grad().")
    if kind == "cross_optimizer_leak" and b:
        used = f" ({step} at {at(s)} used them)" if s else ""
        return (f"loss.backward() at {at(b)} left gradients in these parameters that "
                f"{opt} then stepped on{used}: call {opt}.zero_grad() after it and before "
                f"the backward {opt} should step on, or keep that loss from reaching them "
                f"(requires_grad_(False) around it, or detach() its input).")
    return None
