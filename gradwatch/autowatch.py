"""A watch session over every optimizer a program makes or steps while it is open, as
``gradwatch run`` does for a script, read in slices: the pytest plugin judges one test with
it, the notebook extension one cell at a time.

Thread: training (the test's or the notebook's thread, between its training steps).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gradwatch.wire import Finding

if TYPE_CHECKING:
    from gradwatch.probe.api import WatchHandle

_MAX_PARAMS = 4


@dataclass(frozen=True)
class Slice:
    """What happened since the previous :meth:`AutoWatch.since_last`."""

    steps: int
    """Optimizer steps judged in the slice."""
    findings: list[tuple[Finding, bool]]
    """Findings that gained steps in the slice, each with whether it is new in the run."""


class AutoWatch:
    """Opens a session in ``auto`` mode: every ``torch.optim.Optimizer`` built while it is
    open is attached at once, and one built earlier at its first step. Parameter names come
    from the modules found in memory.

    Args:
        log: step log path; server, run_name, norms_every, run_id: as ``gradwatch.watch()``.

    Raises:
        gradwatch.extras.TorchMissingError: torch is not installed.
        TypeError, ValueError: an argument is wrong.
    """

    def __init__(self, log: str | os.PathLike[str], *, server: str | None = None,
                 run_name: str | None = None, norms_every: int = 1,
                 run_id: str | None = None) -> None:
        from gradwatch.probe import names
        from gradwatch.probe.api import WatchHandle
        from gradwatch.probe.watchargs import validate_options

        validate_options(log, server, run_name, norms_every)
        self.handle: WatchHandle = WatchHandle(
            [], log=log, server=server, run_name=run_name, norms_every=norms_every,
            run_id=run_id, auto=True, namer=names.from_live_modules,
            labeler=names.optimizer_label)
        self._steps = 0
        self._reported: dict[tuple[int, str, str], int] = {}
        """Steps of each finding (by rank, optimizer, kind) at the last slice."""

    @property
    def steps(self) -> int:
        """Optimizer steps judged so far."""
        return int(self.handle.tracker.steps)

    def stepped(self) -> bool:
        """Whether an optimizer stepped since the previous :meth:`since_last` (no wait)."""
        return self.steps != self._steps

    def since_last(self) -> Slice:
        """Steps and findings since the previous call (or the start).

        Waits for the writer thread to judge what was handed to it (at most its poll
        interval): call it between cells or at the end of a test, never inside training.
        """
        steps = self.steps
        self.handle.writer.settle()
        grown = []
        for f in self.handle.findings():
            key = (f.rank, f.optimizer, f.kind)
            before = self._reported.get(key)
            if before is None or f.steps > before:
                grown.append((f, before is None))
            self._reported[key] = f.steps
        out = Slice(steps - self._steps, grown)
        self._steps = steps
        return out

    def close(self, status: str = "finished") -> None:
        """Close the session: hooks removed, wrappers restored, step log ended."""
        self.handle.close(status=status)
