"""``gradwatch check LOG [LOG ...] [--format text|json|sarif]``: judge a run's step logs, for
people and for CI gates.

Several logs are judged together when they are the streams of one run (its ranks, and the
worker processes ``gradwatch run`` watched: ``check run.rank*.jsonl``); each finding names
its rank. Logs of different runs given together are refused.

Exit codes (a contract): 0 no findings, 1 findings, 2 a log is unreadable or invalid (or the
logs are of different runs, or the arguments are wrong), 3 nothing was judged: no optimizer
step in the logs, the run failed before its first step, or the probe turned itself off in
some process (nothing judged after step N there; with findings before that, 1, and the
stop is still said). ``--json`` is ``--format json``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from gradwatch.cliargs import CommandParser, printable, quiet_print, summary
from gradwatch.steplog import LogReader, StepLogError, open_run
from gradwatch.verdict import Verdict, stream_name, verdict_of_logs
from gradwatch.wire import Finding

FORMATS = ("text", "json", "sarif")


def _parse(argv: Sequence[str]) -> tuple[list[str], str]:
    parser = CommandParser(prog="gradwatch check", description=summary(__doc__))
    parser.add_argument("logs", nargs="+", metavar="LOG",
                        help="step logs written by gradwatch (one run's ranks together)")
    parser.add_argument("--format", choices=FORMATS, default=None,
                        help="output: text (default), json (the --json contract) or sarif "
                             "(SARIF 2.1.0 for code-scanning annotations)")
    parser.add_argument("--json", action="store_true", help="same as --format json")
    args = parser.parse_args(argv)
    if args.json and args.format not in (None, "json"):
        parser.error(f"--json and --format {args.format} disagree; give one of them")
    return args.logs, "json" if args.json else (args.format or "text")


def main(argv: Sequence[str]) -> int:
    """Entry point of ``gradwatch check``; returns the exit code."""
    paths, fmt = _parse(argv)
    try:
        logs = open_run(paths)
        try:
            j = verdict_of_logs(logs, combine=True)  # streams each log: none held whole
        finally:
            for log in logs:
                log.close()
    except StepLogError as e:
        print(f"gradwatch check: {printable(str(e))}", file=sys.stderr)
        return 2
    for log in logs:
        for w in log.warnings:
            print(f"gradwatch check: warning: {printable(w)}", file=sys.stderr)
    findings = j.findings()
    nothing = j.nothing_judged()
    stopped = j.stopped_text()
    if fmt == "json":
        text = json.dumps({"findings": [f.model_dump(mode="json") for f in findings],
                           "summary": j.summary()}, indent=2)
    elif fmt == "sarif":
        from gradwatch.sarif import sarif_log

        text = json.dumps(sarif_log(findings, logs, paths, nothing or stopped), indent=2)
    else:
        text = printable("\n".join(_text(paths, logs, j, findings)))
    quiet_print(text)
    if nothing:
        print(f"gradwatch check: nothing judged: {nothing}", file=sys.stderr)
        return 3
    if stopped:  # a run judged in part is never clean
        print(f"gradwatch check: {stopped}", file=sys.stderr)
        return 1 if findings else 3
    return 1 if findings else 0


def _text(paths: list[str], logs: list[LogReader], j: Verdict,
          findings: list[Finding]) -> list[str]:
    from gradwatch.report import finding_lines

    s: dict[str, Any] = j.summary()
    name = logs[0].header.run_name or logs[0].header.run
    counted = (f"{s['steps']} optimizer steps, {len(findings)} "
               f"finding{'s' if len(findings) != 1 else ''}")
    if s["stopped"]:  # never "0 findings" for a run whose judging stopped early
        counted = (f"{s['steps']} optimizer steps judged before the probe stopped, "
                   + (f"{len(findings)} finding{'s' if len(findings) != 1 else ''} in them"
                      if findings else "none of them with a finding"))
    several = len(logs) > 1
    out = [f"run '{name}' ({len(logs)} logs): {counted}" if several
           else f"{paths[0]}: run '{name}', {counted}"]
    if several:
        for log, st in zip(_by_stream(logs), s["streams"], strict=True):
            out.append(f"  {stream_name((st['rank'], st['worker']))}: {st['steps']} steps, "
                       f"{st['status'] or 'no end record'} ({log})")
    nothing = s["nothing_judged"]
    if nothing:
        out.append(f"nothing judged: {nothing}")
    stopped = j.stopped_text()
    if stopped:
        out.append(stopped)
    model = s["model_norms"]
    if model and model["last"]:  # a sharded run: the model's norms, not one rank's shard
        last = model["last"]
        drift = "unknown" if last["drift"] is None else f"{last['drift']:.4g}"
        most = "" if model["max_drift"] is None else f"; largest drift {model['max_drift']:.4g}"
        out.append(f"model gradient norms, {model['ranks']} ranks combined by placement "
                   f"({model['steps']} steps): at step {last['step']} of {last['opt']} "
                   f"||grad|| {last['norm']:.6g}, drift {drift}{most}")
    elif s["status"] in ("failed", "interrupted"):
        out.append(f"note: the run ended {s['status']}; judged the steps it made")
    with_workers = {st["rank"] for st in s["streams"] if st["worker"] is not None}
    for st in s["streams"] if several and not nothing else ():
        # a process whose workers trained (Hogwild) need not step itself
        launched_idle = st["worker"] is None and st["rank"] in with_workers
        if not st["steps"] and not launched_idle:
            out.append(f"note: {stream_name((st['rank'], st['worker']))} made no optimizer "
                       f"step")
    for f in findings:
        out.append("")
        out += finding_lines(f, streams=several)
    return out


def _by_stream(logs: list[LogReader]) -> list[str]:
    """The logs' paths in the order :meth:`Verdict.summary` lists its streams."""
    ordered = sorted(logs, key=lambda log: (log.header.rank, log.header.worker or 0))
    return [str(log.path) for log in ordered]
