"""Jupyter and IPython: ``%load_ext gradwatch``, then ``%gradwatch on|off|status``.

``%gradwatch on [--server URL] [--log PATH] [--name NAME] [--norms-every N]`` attaches to
every optimizer the notebook builds from then on (and to one built earlier, at its first
step), as ``gradwatch run`` does for a script. After each cell that stepped an optimizer it
prints the verdict of that cell: the findings the cell's steps added to or started, with
their fix, and the dashboard link when a server is given. Re-running a training cell
without its ``zero_grad()`` is the classic slip it catches. ``%gradwatch off`` closes the
session; ``%gradwatch status`` says what is watched.

Thread: the kernel's (IPython runs cells and their events there).
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from gradwatch.integrations.sessions import AutoWatch, Slice
from gradwatch.report import finding_lines

_USAGE = ("%gradwatch on [--server URL] [--log PATH] [--name NAME] [--norms-every N]"
          " | off | status")


class NotebookWatch:
    """The ``%gradwatch`` magic and the verdict after each cell, for one IPython shell."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.session: AutoWatch | None = None
        self.server: str | None = None

    # ---------------------------------------------------------------- the magic
    def magic(self, line: str) -> None:
        """``%gradwatch on|off|status``; a wrong line prints the usage (no traceback)."""
        from IPython.core.error import UsageError

        try:
            args = _parser().parse_args(shlex.split(line) or ["status"])
        except (_BadLine, ValueError) as e:
            raise UsageError(f"{e}\nusage: {_USAGE}") from None
        if args.action == "on":
            self.on(args)
        elif args.action == "off":
            self.off()
        else:
            print(self.status())

    def on(self, args: argparse.Namespace) -> None:
        """Open the session (``%gradwatch on``)."""
        from IPython.core.error import UsageError

        if self.session is not None:
            print(f"gradwatch: already on ({self.status()}); %gradwatch off first to "
                  f"change its options")
            return
        from gradwatch.probe import runinfo

        run = runinfo.run_id(None)
        try:
            self.session = AutoWatch(args.log or f"gradwatch-{run}.jsonl", server=args.server,
                                     norms_every=args.norms_every,
                                     run_name=args.name or "notebook", run_id=run)
        except (TypeError, ValueError, ImportError) as e:
            raise UsageError(str(e)) from None
        self.server = args.server
        self.shell.events.register("post_run_cell", self.after_cell)
        print(f"gradwatch: on; watching every optimizer from now on (step log: "
              f"{self.session.handle.path}){self._link()}")

    def off(self) -> None:
        """Close the session (``%gradwatch off``) and print the run's verdict."""
        session, self.session = self.session, None
        if session is None:
            print("gradwatch: off (it was not on)")
            return
        self.shell.events.unregister("post_run_cell", self.after_cell)
        session.since_last()  # what the cells reported stays reported
        session.close()
        findings = session.handle.findings()
        print(f"gradwatch: off after {session.steps} optimizer steps, "
              f"{_count(len(findings), 'finding')} (step log: {session.handle.path})")
        for f in findings:
            print("\n".join("  " + x for x in finding_lines(f)))

    def status(self) -> str:
        """One line: off, or on with its steps, findings and step log."""
        s = self.session
        if s is None:
            return "gradwatch: off (%gradwatch on to watch this notebook's optimizers)"
        return (f"gradwatch: on, {s.steps} optimizer steps, "
                f"{_count(len(s.handle.findings()), 'finding')} so far (step log: "
                f"{s.handle.path}){self._link()}")

    # ---------------------------------------------------------------- after each cell
    def after_cell(self, result: Any = None) -> None:
        """IPython's ``post_run_cell``: the verdict of a cell that stepped, else nothing."""
        s = self.session
        if s is None or not s.stepped():
            return
        print(verdict(s.since_last()) + self._link())

    def _link(self) -> str:
        if self.server is None or self.session is None:
            return ""
        from gradwatch.replay import dashboard_url

        return f"\n  dashboard: {dashboard_url(self.server, self.session.handle.run_id)}"


def verdict(cell: Slice) -> str:
    """A cell's verdict: its steps and the findings it added to, each new or again."""
    if not cell.findings:
        return (f"gradwatch: {_count(cell.steps, 'optimizer step')} in this cell, no "
                f"gradient-reset bug found")
    lines = [f"gradwatch: {_count(cell.steps, 'optimizer step')} in this cell, "
             f"{_count(len(cell.findings), 'finding')}:"]
    for f, new in cell.findings:
        body = finding_lines(f)
        body[0] = f"{body[0]}{'' if new else ' (again in this cell)'}"
        lines += ["  " + x for x in body]
    return "\n".join(lines)


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'s' * (n != 1)}"


class _BadLine(Exception):
    """A ``%gradwatch`` line argparse refused."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would exit the kernel
        raise _BadLine(f"%gradwatch: {message}")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="%gradwatch", add_help=False, usage=_USAGE)
    p.add_argument("action", choices=("on", "off", "status"))
    p.add_argument("--server", default=None)
    p.add_argument("--log", default=None)
    p.add_argument("--name", default=None)
    p.add_argument("--norms-every", type=int, default=1)
    return p


_watches: dict[int, NotebookWatch] = {}


def load_ipython_extension(shell: Any) -> None:
    """``%load_ext gradwatch``: register the ``%gradwatch`` magic (loading twice is fine)."""
    watch = _watches.get(id(shell))
    if watch is None:
        watch = _watches[id(shell)] = NotebookWatch(shell)
    shell.register_magic_function(watch.magic, magic_kind="line", magic_name="gradwatch")


def unload_ipython_extension(shell: Any) -> None:
    """``%unload_ext gradwatch``: close the session if one is open."""
    watch = _watches.pop(id(shell), None)
    if watch is not None and watch.session is not None:
        watch.off()
