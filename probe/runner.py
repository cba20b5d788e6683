"""``gradwatch run [--log PATH] [--server URL] [--name NAME] -- SCRIPT.py [ARGS...]``.

Runs a training script unmodified in this process (like ``python -m cProfile``: ``runpy``,
``sys.argv`` set, ``__main__`` semantics; ``-- -m MODULE`` runs a module), attaching to every
``torch.optim.Optimizer`` the script creates or steps. Writes the step log, prints a short
verdict to stderr at exit, and exits with the script's own exit code (1 after an uncaught
exception, whose traceback is printed). Wrong arguments exit 2.

Thread: the main thread, which runs the script (its training thread).
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gradwatch.cliargs import CommandParser
from gradwatch.wire import Finding

if TYPE_CHECKING:
    from gradwatch.probe.api import WatchHandle

_USAGE = ("gradwatch run [--log PATH] [--server URL] [--name NAME] [--norms-every N] "
          "-- SCRIPT.py [ARGS...] | -- -m MODULE [ARGS...]")




def _parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    argv = list(argv)
    if "--" in argv:
        cut = argv.index("--")
        ours, target = argv[:cut], argv[cut + 1:]
    else:  # allow `gradwatch run script.py args` too: the first non-option starts it
        ours, target = [], []
        it = iter(range(len(argv)))
        for i in it:
            a = argv[i]
            if a in ("--log", "--server", "--name", "--norms-every") and i + 1 < len(argv):
                ours += [a, argv[i + 1]]
                next(it, None)
            elif a.startswith("-") and a not in ("-m",):
                ours.append(a)
            else:
                target = argv[i:]
                break
    p = CommandParser(prog="gradwatch run", usage=_USAGE, description=__doc__.splitlines()[0])
    p.add_argument("--log", default=os.environ.get("GRADWATCH_LOG"),
                   help="step log path (default: gradwatch-<run id>.jsonl here)")
    p.add_argument("--server", default=os.environ.get("GRADWATCH_SERVER"),
                   help="gradwatch server URL to stream to")
    p.add_argument("--name", default=None, help="run name (default: the script name)")
    p.add_argument("--norms-every", type=int, default=1,
                   help="sample gradient norms every N steps (0 = never)")
    args = p.parse_args(ours)
    if not target:
        p.error("nothing to run: put the script after --, e.g. "
                "gradwatch run -- train.py --epochs 3")
    if target[0] == "-m":
        if len(target) < 2:
            p.error("-m needs a module name, e.g. gradwatch run -- -m mypkg.train")
    elif not Path(target[0]).is_file():
        p.error(f"script not found: {target[0]}")
    if args.norms_every < 0:
        p.error("--norms-every must be >= 0")
    return args, target


def _run_target(target: list[str]) -> int:
    """Run the script or module as ``__main__``; return its exit code."""
    saved_argv, saved_path0 = sys.argv[:], sys.path[0] if sys.path else None
    try:
        if target[0] == "-m":
            sys.argv = [target[1], *target[2:]]
            sys.path.insert(0, os.getcwd())
            runpy.run_module(target[1], run_name="__main__", alter_sys=True)
        else:
            script = os.path.abspath(target[0])
            sys.argv = [target[0], *target[1:]]
            if sys.path:
                sys.path[0] = os.path.dirname(script)
            else:
                sys.path.insert(0, os.path.dirname(script))
            runpy.run_path(script, run_name="__main__")
        return 0
    except SystemExit as e:
        code = e.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        traceback.print_exc()
        return 130
    except BaseException:  # noqa: BLE001 - the script's error, reported like python does
        traceback.print_exc()
        return 1
    finally:
        sys.argv = saved_argv
        if target[0] == "-m" and sys.path and sys.path[0] == os.getcwd():
            sys.path.pop(0)
        elif saved_path0 is not None and sys.path:
            sys.path[0] = saved_path0


def _verdict(findings: list[Finding], steps: int, path: Path | None, disabled: str | None,
             dropped: int) -> str:
    lines = []
    where = f" (step log: {path})" if path else ""
    if disabled:
        lines.append(f"gradwatch: the probe turned itself off: {disabled}")
    if not findings:
        lines.append(f"gradwatch: {steps} optimizer steps, no gradient-reset bug found"
                     f"{where}")
    else:
        lines.append(f"gradwatch: {steps} optimizer steps, {len(findings)} finding"
                     f"{'s' if len(findings) != 1 else ''}{where}")
        for f in findings:
            params = ", ".join(f.params[:4]) + (" ..." if len(f.params) > 4 else "")
            lines.append(f"  {f.kind}  {f.optimizer}  first_step={f.first_step}  "
                         f"steps={f.steps}  params: {params}")
            lines.append(f"    fix: {f.fix}")
    if dropped:
        lines.append(f"gradwatch: {dropped} records were dropped (queue full)")
    return "\n".join(lines)


def _print_unsent(handle: WatchHandle) -> None:
    """The verdict's line on records the server never acknowledged (none: nothing)."""
    report = handle.unsent_report()
    if report:
        print(report, file=sys.stderr)


def main(argv: Sequence[str]) -> int:
    """Entry point of ``gradwatch run``; returns the exit code."""
    args, target = _parse(argv)
    from gradwatch.probe import names, runinfo
    from gradwatch.probe.api import WatchHandle

    run = runinfo.run_id(None)
    log = args.log
    if log is None:
        log = f"gradwatch-{run}.jsonl"
    name = args.name or (target[1] if target[0] == "-m" else Path(target[0]).stem)
    handle = WatchHandle([], run_id=run, log=log, server=args.server, run_name=name,
                         norms_every=args.norms_every, auto=True,
                         namer=names.from_live_modules, report_unsent=False)
    print(f"gradwatch: writing the step log to {handle.path}", file=sys.stderr)
    code = _run_target(target)
    status = "finished" if code == 0 else ("interrupted" if code == 130 else "failed")
    handle.close(status=status, exit_code=code)
    print(_verdict(handle.findings(), handle.tracker.steps, handle.path,
                   handle.tracker.disabled, handle.writer.dropped), file=sys.stderr)
    _print_unsent(handle)
    return code
