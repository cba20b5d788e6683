"""Findings as text for people: ``gradwatch check``, ``gradwatch run``'s verdict, the notebook
magic and ``pytest --gradwatch`` all print them with :func:`finding_lines`.

Each finding gets a heading line, the source lines it involves (``train.py:12``, primary
line first, with the code on that line when the file is here to read), its parameters, its
message and its fix.
"""

from __future__ import annotations

import linecache

from gradwatch.locations import at, primary
from gradwatch.verdict import stream_name
from gradwatch.wire import Finding, Where

_MAX_PARAMS = 6
_MAX_CODE = 80


def _code(w: Where) -> str:
    """The source line ``w`` points at, stripped and shortened; empty when unreadable."""
    text = linecache.getline(w.file, w.line).strip() if w.line else ""
    return text if len(text) <= _MAX_CODE else text[:_MAX_CODE - 3] + "..."


def where_lines(f: Finding) -> list[str]:
    """``train.py:12  reset     in main: opt.zero_grad()``, primary line first."""
    first = primary(f)
    ordered = ([first] if first else []) + [w for w in f.where if w is not first]
    width = max((len(at(w)) for w in ordered), default=0)
    out = []
    for w in ordered:
        code = _code(w)
        out.append(f"{at(w):<{width}}  {w.role:<8}  in {w.function}"
                   + (f": {code}" if code else ""))
    return out


def finding_lines(f: Finding, streams: bool = False) -> list[str]:
    """A finding as lines: heading, ``at:`` lines, params, message, fix. ``streams``: name
    the rank (or worker) it is in (several streams judged together)."""
    head = (f"{f.kind} on {f.optimizer}, from step {f.first_step} "
            f"({f.steps} step{'s' * (f.steps != 1)})")
    if streams or f.worker is not None:
        head += f", {stream_name((f.rank, f.worker))}"
    lines = [head]
    for i, w in enumerate(where_lines(f)):
        lines.append(("  at: " if i == 0 else "      ") + w)
    shown = ", ".join(f.params[:_MAX_PARAMS])
    if len(f.params) > _MAX_PARAMS:
        shown += f", ... ({len(f.params)} in all)"
    lines.append(f"  params: {shown or '-'}")
    lines.append(f"  {f.message}")
    lines.append(f"  fix: {f.fix}")
    return lines
