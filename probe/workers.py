"""Processes the script starts itself (``torch.multiprocessing``, ``multiprocessing``), each
watched as a stream of the same run.

Thread: main (``Process.start`` in the parent; the wrapper at the start of the child).

Under ``gradwatch run``, ``multiprocessing``'s ``BaseProcess.start`` is wrapped: a process
started with a ``target`` gets it wrapped in :class:`Watched`, which carries the run's
:class:`~gradwatch.probe.autostart.Plan` with the worker's number and log
(``<log stem>.worker<N>.jsonl``) into the child, whether it is forked or spawned. There it
installs an :class:`~gradwatch.probe.autostart.AutoSession` of its own (a forked child first
drops the copy of its parent's session, without writing to the parent's log) and closes it
when the target returns. Like ``gradwatch run`` itself, a worker that never builds an
optimizer (a ``DataLoader`` worker) gets no session and writes no log.

Workers write step logs only: their records are not streamed to a server (a server keys
streams by rank, which workers share with their parent).
"""

from __future__ import annotations

import functools
import itertools
from typing import Any

from gradwatch.probe import autostart

_counter = itertools.count(1)
_orig_start: Any = None


class Watched:
    """A process target that runs under its own watch session (picklable with its target)."""

    def __init__(self, target: Any, plan: autostart.Plan) -> None:
        self.target = target
        self.plan = plan

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        inherited = autostart.current()
        if inherited is not None:  # forked: the parent's session came along
            inherited.abandon()
        global _counter
        _counter = itertools.count(1)
        session = autostart.AutoSession(self.plan)
        session.announce = False
        session.install()
        status, code = "failed", 1
        try:
            out = self.target(*args, **kwargs)
            status, code = "finished", 0
            return out
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            status = "finished" if code == 0 else "failed"
            raise
        except KeyboardInterrupt:
            status, code = "interrupted", 130
            raise
        finally:
            session.close(status, code, open_if_idle=False)


def _number(session: autostart.AutoSession) -> int:
    """The next worker number: 1, 2, ... in the runner's process; ``W*1000 + n`` in worker
    ``W``, so that numbers stay unique in the run."""
    n = next(_counter)
    parent = session.plan.worker
    return n if parent is None else parent * 1000 + n


def _start(self: Any) -> Any:
    session = autostart.current()
    target = getattr(self, "_target", None)
    if session is not None and target is not None and not isinstance(target, Watched):
        self._target = Watched(target, session.worker_plan(_number(session)))
    return _orig_start(self)


def install() -> None:
    """Wrap ``BaseProcess.start`` (once) while a session is installed."""
    global _orig_start
    if _orig_start is not None:
        return
    from multiprocessing.process import BaseProcess

    _orig_start = BaseProcess.start
    BaseProcess.start = functools.wraps(_orig_start)(_start)  # type: ignore[method-assign]


def uninstall() -> None:
    """Put ``BaseProcess.start`` back."""
    global _orig_start
    if _orig_start is None:
        return
    from multiprocessing.process import BaseProcess

    BaseProcess.start = _orig_start  # type: ignore[method-assign]
    _orig_start = None
