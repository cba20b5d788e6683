"""What ``gradwatch run`` says at the end: the verdict of this process and of the worker
processes it started, in words that say what happened (a script that raised, could not be
loaded or never stepped an optimizer is never called clean), and the launch that works when
the target was a launcher.

Thread: main (after the script returned).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gradwatch.probe.autostart import AutoSession
    from gradwatch.wire import Finding

_LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch")


@dataclass
class Outcome:
    """How the script ended: its exit code, and what stopped it."""

    code: int
    error: str | None = None
    """The uncaught exception (``RuntimeError: boom``), if one ended it."""
    started: bool = True
    """False when the script or module could not even be loaded."""

    @property
    def status(self) -> str:
        return "finished" if self.code == 0 else ("interrupted" if self.code == 130
                                                  else "failed")


def launcher(target: list[str], log: str) -> str | None:
    """For a launcher (torchrun) as the target: what to run instead, else None."""
    module = target[1] if target[0] == "-m" and len(target) > 1 else None
    name = module or Path(target[0]).name
    if name not in _LAUNCHERS:
        return None
    rest = target[2:] if module else target[1:]
    how: tuple[str, ...] = ("torchrun", "--nproc_per_node", "2")
    try:
        from torch.distributed.run import get_args_parser

        a = get_args_parser().parse_args(rest)
        cut = len(rest) - len(a.training_script_args) - 1
        launch = rest[:cut]
        script = [a.training_script, *a.training_script_args]
        if a.module:
            script = ["-m", *script]
            launch = [x for x in launch if x not in ("-m", "--module")]
        how = ("torchrun", *launch)
    except BaseException:  # noqa: BLE001 - argparse exits on what it cannot read
        script = ["train.py"]
    return (f"{name} starts the training in new processes, which this process does not "
            f"watch. Launch gradwatch inside each of them instead: "
            f"{' '.join(how)} -m gradwatch run --step-log {log} -- {' '.join(script)}")


def judge(session: AutoSession) -> tuple[list[Finding], int, int]:
    """``(findings, optimizer steps, streams)`` of this process and the workers it
    started (read back from their logs)."""
    handle, path = session.handle, session.path
    if path is None:  # the session failed before it had a log
        return [], 0, 1
    stem, suffix = f"{path.stem}.worker", path.suffix
    worker_logs = sorted(p for p in path.parent.iterdir()
                         if p.name.startswith(stem) and p.name.endswith(suffix)
                         ) if path.parent.is_dir() else []
    if not worker_logs:
        return ([], 0, 1) if handle is None else (handle.findings(), handle.tracker.steps, 1)
    from gradwatch.steplog import StepLogError, read_run
    from gradwatch.verdict import verdict_of_logs

    try:
        logs = read_run([path, *worker_logs])
    except StepLogError as e:
        print(f"gradwatch: cannot read the workers' step logs: {e}", file=sys.stderr)
        return [], 0, 1
    j = verdict_of_logs(logs)
    return j.findings(), j.steps, len(logs)


def verdict(outcome: Outcome, findings: list[Finding], steps: int, streams: int,
             session: AutoSession, launcher: str | None) -> str:
    handle = session.handle
    if session.failed:
        return f"gradwatch: could not watch this run ({session.failed}): nothing was judged"
    lines = []
    if handle is not None and handle.world_size > 1:  # each rank prints its own verdict
        lines.append(f"gradwatch: rank {handle.rank} of {handle.world_size}:")
    disabled = handle.disabled if handle is not None else None
    if disabled and handle is not None:
        lines.append(f"gradwatch: {handle.stopped()}")
    where = f" (step log: {session.path}" + (
        f" and {streams - 1} worker logs beside it)" if streams > 1 else ")")
    counted = f"{steps} optimizer step{'s' if steps != 1 else ''}" + (
        f" in {streams} processes" if streams > 1 else "")
    found = (f"{len(findings)} finding{'s' if len(findings) != 1 else ''}" if findings
             else "no finding")
    if not outcome.started:
        lines.append(f"gradwatch: the script could not be loaded ({outcome.error}); nothing "
                     f"was judged{where}")
    elif outcome.code != 0 and steps == 0:
        why = outcome.error or f"exit code {outcome.code}"
        lines.append(f"gradwatch: the script {_ended(outcome)} ({why}) before any optimizer "
                     f"step: nothing was judged{where}")
    elif steps == 0:
        lines.append(f"gradwatch: no optimizer stepped in this process, so nothing was "
                     f"judged{where}")
        if launcher:
            lines.append(f"gradwatch: {launcher}")
    elif outcome.code != 0:
        why = outcome.error or f"exit code {outcome.code}"
        lines.append(f"gradwatch: the script {_ended(outcome)} ({why}) after {counted}; in "
                     f"those steps, {found}{where}")
    elif disabled:
        lines.append(f"gradwatch: {counted} judged before the probe turned off, {found}"
                     f"{where}")
    elif not findings:
        lines.append(f"gradwatch: {counted}, no gradient-reset bug found{where}")
    else:
        lines.append(f"gradwatch: {counted}, {found}{where}")
    if findings:  # (only then: the report's modules, the verdict's among them, load)
        from gradwatch.report import finding_lines

        for f in findings:
            lines += ["  " + x for x in finding_lines(f, streams=streams > 1)]
    if handle is not None and handle.writer.dropped:
        lines.append(f"gradwatch: {handle.writer.dropped} records were dropped (queue full)")
    return "\n".join(lines)


def _ended(outcome: Outcome) -> str:
    return "was interrupted" if outcome.code == 130 else (
        "raised" if outcome.error else "exited")
