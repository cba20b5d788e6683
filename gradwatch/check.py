"""``gradwatch check LOG [--json]``: judge a step log, for people and for CI gates.

Exit codes (a contract): 0 no findings, 1 findings, 2 the log is unreadable or invalid.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from gradwatch.cliargs import CommandParser
from gradwatch.steplog import StepLogError, read_log
from gradwatch.verdict import verdict_of


def main(argv: Sequence[str]) -> int:
    parser = CommandParser(prog="gradwatch check", description=__doc__.splitlines()[0])
    parser.add_argument("log", help="path of a step log written by gradwatch")
    parser.add_argument("--json", action="store_true", help="print findings as JSON")
    args = parser.parse_args(argv)
    try:
        log = read_log(args.log)
    except StepLogError as e:
        print(f"gradwatch check: {e}", file=sys.stderr)
        return 2
    for w in log.warnings:
        print(f"gradwatch check: warning: {w}", file=sys.stderr)
    j = verdict_of([log.header, *log.records])
    findings = j.findings()
    summary = j.summary()
    if args.json:
        out = {
            "findings": [f.model_dump() for f in findings],
            "summary": summary,
        }
        print(json.dumps(out, indent=2))
    else:
        name = log.header.run_name or log.header.run
        print(f"{args.log}: run '{name}', {summary['steps']} optimizer steps, "
              f"{len(findings)} finding{'s' if len(findings) != 1 else ''}")
        for f in findings:
            params = ", ".join(f.params[:6]) + (f", ... ({len(f.params)} in all)"
                                                 if len(f.params) > 6 else "")
            print(f"\n{f.kind}  optimizer={f.optimizer}  first_step={f.first_step}  "
                  f"steps={f.steps}")
            print(f"  params: {params or '-'}")
            print(f"  {f.message}")
            print(f"  fix: {f.fix}")
    return 1 if findings else 0
