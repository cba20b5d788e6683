"""The watch session of ``gradwatch run``, opened at the script's first optimizer or backward.

Thread: training (the wrapper runs where the script builds an optimizer; the rest on the
main thread).

A script that only imports torch, or that never trains, pays for none of the probe: until
the first ``torch.optim.Optimizer`` is constructed or the first backward runs, only thin
wrappers of ``Optimizer.__init__`` and ``torch.autograd.backward`` are installed. The first
of them opens the session (a :class:`~gradwatch.probe.api.WatchHandle` in ``auto`` mode,
which from then on attaches to every optimizer), and an optimizer that opened it is
attached to it. A process where neither happened gets a step log at
:meth:`AutoSession.close` that still says how the run ended.
"""

from __future__ import annotations

import functools
import logging
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gradwatch.probe.api import WatchHandle


@dataclass(frozen=True)
class Plan:
    """What ``gradwatch run`` was asked for: the same in every process of the run, but
    ``log`` and ``worker`` (picklable: worker processes get theirs)."""

    log: str
    """This process's step log path, as given (``.rank<R>`` is added in a rank of a
    job); exact in a worker process."""
    run_name: str
    norms_every: int = 1
    server: str | None = None
    run: str | None = None
    """Run id; None: found when needed (:func:`gradwatch.probe.runinfo.run_id`)."""
    worker: int | None = None
    """The worker number of a process the script started, None in a launched one."""


log = logging.getLogger("gradwatch.probe")

_current: AutoSession | None = None
"""This process's session (one at a time)."""


def current() -> AutoSession | None:
    """The session installed in this process, if any."""
    return _current


class AutoSession:
    """Opens the watch session at the first optimizer or backward (module docstring).

    Use :meth:`install` before the script runs and :meth:`close` after it.
    """

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.handle: WatchHandle | None = None
        self.path: Path | None = None
        """This process's step log, once :meth:`prepare` found it."""
        self.replaced = False
        """True when :meth:`prepare` removed the log of an earlier run at ``path``."""
        self.announce = True
        """Print where the log goes when it is opened (the runner's process)."""
        self.failed: str | None = None
        """Why the session could not be opened, if it could not (training went on)."""
        self._saved: list[tuple[Any, str, Any]] = []

    def fail(self, exc: BaseException) -> None:
        """Opening the session failed: say so once; the script runs on unwatched."""
        self.failed = f"{type(exc).__name__}: {exc}"
        log.error("gradwatch: cannot watch this run (%s); training goes on unwatched",
                  self.failed, exc_info=None if isinstance(exc, OSError) else exc)

    # ------------------------------------------------------------------ set-up
    def install(self) -> None:
        """Wrap ``Optimizer.__init__`` and ``torch.autograd.backward`` so that the first
        optimizer, or the first backward (a loop that updates parameters by hand), opens the
        session."""
        global _current
        import torch

        _current = self
        session = self
        init = torch.optim.Optimizer.__dict__["__init__"]
        backward = torch.autograd.__dict__["backward"]
        self._saved = [(torch.optim.Optimizer, "__init__", init),
                       (torch.autograd, "backward", backward)]

        @functools.wraps(init)
        def __init__(opt: Any, *args: Any, **kwargs: Any) -> None:
            init(opt, *args, **kwargs)
            if session.wanted() and (handle := session.try_open()) is not None:
                try:
                    handle.tracker.attach(opt, instance_hooks=False)
                except Exception as e:  # noqa: BLE001 - never break the script's constructor
                    session.fail(e)

        @functools.wraps(backward)
        def first_backward(*args: Any, **kwargs: Any) -> Any:
            if session.wanted() and session.try_open() is not None:
                # through the probe's own wrapper, installed by now (it calls this one back)
                return torch.autograd.backward(*args, **kwargs)
            return backward(*args, **kwargs)

        from gradwatch.probe.nocompile import skip_tracing

        torch.optim.Optimizer.__init__ = __init__  # type: ignore[method-assign,assignment]
        torch.autograd.backward = skip_tracing(first_backward, "gradwatch's start")
        from gradwatch.probe import workers

        workers.install()

    def wanted(self) -> bool:
        """Whether an event should open the session: not open yet, not failed, current."""
        return self.handle is None and self.failed is None and _current is self

    def try_open(self) -> WatchHandle | None:
        """:meth:`open`, or None (said once) when it fails: training goes on unwatched."""
        try:
            return self.open()
        except Exception as e:  # noqa: BLE001
            self.fail(e)
            return None

    def uninstall(self) -> None:
        """Put back what :meth:`install` wrapped (after the session closed)."""
        global _current
        for owner, attr, orig in reversed(self._saved):
            setattr(owner, attr, orig)
        self._saved = []
        if _current is self:
            _current = None
            from gradwatch.probe import workers

            workers.uninstall()

    def prepare(self) -> Path:
        """Fix the run id and this process's log path, and remove what an earlier run left
        there (its log, and its workers' logs); once. Returns the path."""
        if self.path is not None:
            return self.path
        from gradwatch.probe import runinfo

        plan = self.plan
        if plan.run is None:
            plan = self.plan = replace(plan, run=runinfo.run_id(None))
        if plan.worker is not None:
            self.path = Path(plan.log)
        else:
            self.path = runinfo.log_path(plan.log, *runinfo.rank_world())
        self.replaced = _remove_log(self.path)
        stem, suffix = f"{self.path.stem}.worker", self.path.suffix
        try:
            for old in self.path.parent.iterdir():
                if old.name.startswith(stem) and old.name.endswith(suffix):
                    _remove_log(old)
        except OSError:  # no folder yet: the writer makes it
            pass
        return self.path

    def worker_plan(self, worker: int) -> Plan:
        """The plan of the ``worker``-th process this one starts."""
        from gradwatch.probe import runinfo

        path = self.prepare()
        return replace(self.plan, log=str(runinfo.worker_log_path(path, worker)),
                       server=None, worker=worker)

    # ------------------------------------------------------------------ session
    def open(self) -> WatchHandle:
        """The session, opened now if it is not yet."""
        if self.handle is not None:
            return self.handle
        from gradwatch.probe import names
        from gradwatch.probe.api import WatchHandle

        path = self.prepare()
        p = self.plan
        self.handle = WatchHandle([], run_id=p.run, log=path, server=p.server,
                                  run_name=p.run_name, norms_every=p.norms_every, auto=True,
                                  namer=names.from_frames, labeler=names.optimizer_label,
                                  worker=p.worker, exact_log=True, report_unsent=False)
        self._announce(path)
        return self.handle

    def _announce(self, path: Path) -> None:
        if self.announce:
            again = " (replaced the step log of an earlier run)" if self.replaced else ""
            print(f"gradwatch: writing the step log to {path}{again}", file=sys.stderr)

    def close(self, status: str, exit_code: int | None, *,
              open_if_idle: bool = True) -> WatchHandle | None:
        """End the session: write ``End`` with the script's ``status`` and exit code and
        put everything back. Returns the closed session, None if no optimizer opened one.

        With no optimizer seen, ``open_if_idle`` still writes a step log that says how the
        run ended (a header, ``Stats`` and ``End``: ``check`` then reports that nothing was
        judged), without loading the probe unless the run streams to a server.
        """
        handle = self.handle
        try:
            if handle is None and open_if_idle and self.failed is None:
                if self.plan.server is not None:
                    handle = self.open()
                else:
                    self._write_idle_log(status, exit_code)
            if handle is not None:
                handle.close(status=status, exit_code=exit_code)
        except Exception as e:  # noqa: BLE001 - the script's exit code must still come out
            self.fail(e)
        finally:
            self.uninstall()
        return handle

    def _write_idle_log(self, status: str, exit_code: int | None) -> None:
        import time

        from gradwatch.probe import runinfo
        from gradwatch.steplog import StepLogWriter
        from gradwatch.wire import End, Stats

        path = self.prepare()
        p = self.plan
        assert p.run is not None
        header = runinfo.header(p.run, p.run_name, *runinfo.rank_world(), p.norms_every,
                                p.worker)
        now = time.time()
        with StepLogWriter(path) as w:
            w.write(header)
            w.write(Stats(seq=1, t=now))
            w.write(End(seq=2, t=now, status=status,  # type: ignore[arg-type]
                        exit_code=exit_code))
        self._announce(path)

    def abandon(self) -> None:
        """In a forked child: stop routing torch's events to the parent's session copy
        without writing to the parent's log, and put everything back."""
        handle = self.handle
        if handle is not None:
            from gradwatch.probe import patches

            handle.tracker.close()
            patches.unregister(handle.tracker)
            # Kept referenced: freeing its file object would flush the parent's buffered
            # lines a second time into the parent's log, through the shared descriptor.
            _abandoned.append(handle)
        self.uninstall()


_abandoned: list[Any] = []


def is_other_file(path: Path) -> bool:
    """Whether ``path`` holds something that is not a step log (a step log must not be
    written over it)."""
    try:
        with path.open("rb") as fh:
            first = fh.readline(4096)
    except OSError:
        return False
    return bool(first.strip()) and b'"type":"header"' not in first.replace(b" ", b"")


def _remove_log(path: Path) -> bool:
    """Remove ``path`` if it is a gradwatch step log; True if it did."""
    if not path.is_file() or is_other_file(path) or path.stat().st_size == 0:
        return False
    path.unlink()
    return True
