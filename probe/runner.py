"""``gradwatch run [--log PATH] [--server URL] [--name NAME] [--fail-on-findings] -- SCRIPT.py
[ARGS...]``.

Runs a training script unmodified in this process (like ``python -m cProfile``: ``runpy``,
``sys.argv`` set, ``__main__`` semantics; ``-- -m MODULE`` runs a module, and a Python
console script on the ``PATH`` runs by its name), attaching to every
``torch.optim.Optimizer`` the script creates, in this process and in the worker processes
it starts itself (:mod:`.workers`). Writes the step log (replacing one an earlier run left
at the same path), prints a verdict to stderr at exit that says what happened, and exits
with the script's own exit code (1 after an uncaught exception, whose traceback, the
script's own frames only, is printed); with ``--fail-on-findings``, 1 also when the script
succeeded and there are findings. Wrong arguments exit 2.

Under torchrun each rank runs its own ``gradwatch run``:
``torchrun --nproc_per_node 2 -m gradwatch run --step-log run.jsonl -- train.py``
(``--step-log`` is ``--log``, spelt so that torchrun's parser does not take it for an
abbreviation of its own ``--log-dir``).

Thread: the main thread, which runs the script (its training thread).
"""

from __future__ import annotations

import argparse
import os
import runpy
import shutil
import sys
import tempfile
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gradwatch.cliargs import CommandParser
from gradwatch.probe import runreport
from gradwatch.probe.runreport import Outcome
from gradwatch.steplog import log_path_problem

if TYPE_CHECKING:
    from gradwatch.probe.api import WatchHandle

_USAGE = ("gradwatch run [--log PATH] [--server URL] [--name NAME] [--norms-every N] "
          "[--fail-on-findings] -- SCRIPT.py [ARGS...] | -- -m MODULE [ARGS...]")
_VALUED = ("--log", "--step-log", "--server", "--name", "--norms-every")


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
            if a in _VALUED and i + 1 < len(argv):
                ours += [a, argv[i + 1]]
                next(it, None)
            elif a.startswith("-") and a not in ("-m",):
                ours.append(a)
            else:
                target = argv[i:]
                break
    p = CommandParser(prog="gradwatch run", usage=_USAGE, description=(
        "Run a training script unmodified under the probe: attach to every optimizer it "
        "creates, write the step log, and print a verdict at exit."))
    p.add_argument("--log", "--step-log", dest="log", default=os.environ.get("GRADWATCH_LOG"),
                   help="step log path (default: gradwatch-<run id>.jsonl here, or with "
                        "--server a spool file under ~/.cache/gradwatch/spool or "
                        "$GRADWATCH_SPOOL_DIR, printed at start; a log an earlier run left "
                        "there is replaced). Under torchrun, spell it --step-log: torchrun "
                        "reads --log as its own --log-dir")
    p.add_argument("--server", default=os.environ.get("GRADWATCH_SERVER"),
                   help="gradwatch server URL to stream to; several, comma-separated "
                        "(ws://A,ws://B: servers sharing one database), to move to the "
                        "next when one fails")
    p.add_argument("--name", default=None, help="run name (default: the script name)")
    p.add_argument("--norms-every", type=int, default=1,
                   help="sample gradient norms every N steps (0 = never)")
    p.add_argument("--fail-on-findings", action="store_true",
                   help="exit 1 when the script succeeded but there are findings (for CI)")
    args = p.parse_args(ours)
    # argument errors first, then the files they name
    if args.norms_every < 0:
        p.error("--norms-every must be >= 0")
    if args.server is not None:
        from gradwatch.stream import ingest_urls

        try:
            ingest_urls(args.server)
        except ValueError as e:
            p.error(f"--server: {e}")
    if not target:
        p.error("nothing to run: put the script after --, e.g. "
                "gradwatch run -- train.py --epochs 3")
    if target[0] == "-m":
        if len(target) < 2:
            p.error("-m needs a module name, e.g. gradwatch run -- -m mypkg.train")
    elif Path(target[0]).is_dir():
        p.error(f"{target[0]} is a folder; give a script (train.py) or a module "
                f"(-- -m package.train)")
    elif not Path(target[0]).is_file():
        # console scripts of this environment sit beside its interpreter, on PATH or not
        search = os.pathsep.join((os.environ.get("PATH", ""), os.path.dirname(sys.executable)))
        found = shutil.which(target[0], path=search) if os.sep not in target[0] else None
        if found is None:
            p.error(f"script not found: {target[0]}")
        elif not _is_python(found):
            p.error(f"{target[0]} is not a Python script ({found}); gradwatch run runs "
                    f"Python scripts and modules in its own process")
        target = [found, *target[1:]]
    if args.log is not None:
        from gradwatch.probe.autostart import is_other_file

        why = log_path_problem(args.log, streamed=args.server is not None)
        if why is not None:
            p.error(f"--log {args.log} {why}")
        try:  # the log's folder now: a typo must not cost a training run
            folder = Path(args.log).absolute().parent
            folder.mkdir(parents=True, exist_ok=True)
            tempfile.TemporaryFile(dir=folder).close()
        except OSError as e:
            p.error(f"--log {args.log}: cannot write there ({e.strerror or e})")

        if is_other_file(Path(args.log)):
            p.error(f"--log {args.log} is a file that is not a gradwatch step log; give "
                    f"another path (a step log of an earlier run there would be replaced)")
    return args, target


def _is_python(path: str) -> bool:
    """Whether ``path`` is a Python script (``.py``, or a ``#!...python`` first line)."""
    if path.endswith(".py"):
        return True
    try:
        with open(path, "rb") as fh:
            first = fh.readline(256)
    except OSError:
        return False
    return first.startswith(b"#!") and b"python" in first


def _run_target(target: list[str]) -> Outcome:
    """Run the script or module as ``__main__``; return how it ended."""
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
        return Outcome(0)
    except SystemExit as e:
        code = e.code
        if code is None:
            return Outcome(0)
        if isinstance(code, int):
            return Outcome(code)
        print(code, file=sys.stderr)
        return Outcome(1)
    except KeyboardInterrupt as e:
        _print_script_traceback(e)
        return Outcome(130, "KeyboardInterrupt")
    except BaseException as e:  # noqa: BLE001 - the script's error, reported like python does
        started = _print_script_traceback(e)
        return Outcome(1, f"{type(e).__name__}: {e}"[:300], started)
    finally:
        sys.argv = saved_argv
        if target[0] == "-m" and sys.path and sys.path[0] == os.getcwd():
            sys.path.pop(0)
        elif saved_path0 is not None and sys.path:
            sys.path[0] = saved_path0


def _print_script_traceback(e: BaseException) -> bool:
    """Print ``e`` as python would for the script: without this runner's and runpy's frames
    on top. Returns whether any of the script's frames was left (False: the script or
    module could not be loaded at all)."""
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_globals.get("__name__") in ("runpy", __name__):
        tb = tb.tb_next
    print("".join(traceback.format_exception(type(e), e, tb)), end="", file=sys.stderr)
    return tb is not None


def _print_unsent(handle: WatchHandle) -> None:
    """The verdict's line on records the server never acknowledged (none: nothing)."""
    report = handle.unsent_report()
    if report:
        print(report, file=sys.stderr)


def main(argv: Sequence[str]) -> int:
    """Entry point of ``gradwatch run``; returns the exit code."""
    args, target = _parse(argv)
    from gradwatch.probe import runinfo
    from gradwatch.probe.autostart import AutoSession, Plan

    name = (args.name or (target[1] if target[0] == "-m" else Path(target[0]).stem))[:200]
    log, run = args.log, runinfo.run_id(None)  # now: the default log's name, the run's page
    if log is None:
        log = f"gradwatch-{run}.jsonl"
        if args.server:  # streamed: the step log is the spool, out of the working folder
            log = str(runinfo.spool_path(run, 0).with_name(f"{run}.jsonl"))
            print(f"gradwatch: streaming to {args.server}; the step log (the spool, which "
                  f"keeps every record) is {log}", file=sys.stderr)
    if args.server and runinfo.rank_world()[0] == 0:  # once a job
        from gradwatch.replay import dashboard_url
        from gradwatch.stream import ingest_urls

        first = ingest_urls(args.server)[0]  # (the servers share one database)
        print(f"gradwatch: the run, live on the dashboard: {dashboard_url(first, run)}",
              file=sys.stderr)
    session = AutoSession(Plan(log=log, run_name=name, norms_every=args.norms_every,
                               server=args.server, run=run))
    launcher = runreport.launcher(target, args.log or "run.jsonl")
    if launcher:
        print(f"gradwatch: {launcher}", file=sys.stderr)
    session.install()
    outcome = _run_target(target)
    session.close(outcome.status, outcome.code)
    findings, steps, streams = runreport.judge(session)
    print(runreport.verdict(outcome, findings, steps, streams, session, launcher),
          file=sys.stderr)
    if session.handle is not None:
        _print_unsent(session.handle)
    if args.fail_on_findings and outcome.code == 0 and findings:
        return 1
    return outcome.code


