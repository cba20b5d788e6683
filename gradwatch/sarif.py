"""Findings as SARIF 2.1.0, the format GitHub code scanning (and other CI tools) annotate
code from: ``gradwatch check --format sarif``.

One run (``gradwatch``), one rule per finding kind (its help is the kind's generic fix),
one result per finding, located at the finding's primary line (see
:mod:`gradwatch.locations`), with the other lines it involves as related locations. File
URIs are relative to the repository root (the nearest folder above the working directory
that holds ``.git``; else the working directory) when the file lies under it, so that code
scanning finds them in the repository; else absolute ``file://`` URIs. A finding with no
line (a log written before the probe recorded lines, or a call it could not place) is
located at line 1 of the training script named in the log's header, or of the log itself.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from gradwatch import __version__
from gradwatch.fixes import generic_fix
from gradwatch.locations import primary
from gradwatch.steplog import LogReader, StepLog
from gradwatch.wire import FINDING_KINDS, Finding, Where

SCHEMA = ("https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/"
          "sarif-schema-2.1.0.json")
_BASE = "%SRCROOT%"

_SHORT = {
    "missed_reset": "Gradients re-applied: no reset between optimizer steps",
    "cross_optimizer_leak": "An optimizer stepped on gradients another loss left",
    "late_reset": "Reset between backward() and step() threw the fresh gradient away",
    "discarded_accumulation": "Reset inside an accumulation window discarded gradients",
}


def repo_root(start: str | None = None) -> Path:
    """The nearest folder at or above ``start`` (default: the working directory) holding
    ``.git``; ``start`` itself when there is none."""
    here = Path(start or os.getcwd()).resolve()
    for d in (here, *here.parents):
        if (d / ".git").exists():
            return d
    return here


def _artifact(file: str, root: Path) -> dict[str, Any]:
    p = Path(file)
    if not p.is_absolute():  # relative to where the run ran: assume the same place
        p = Path.cwd() / p
    p = Path(os.path.normpath(p))
    try:
        rel = p.relative_to(root)
    except ValueError:
        return {"uri": p.as_uri()}
    return {"uri": quote(rel.as_posix()), "uriBaseId": _BASE}


def _location(file: str, line: int, root: Path) -> dict[str, Any]:
    return {"physicalLocation": {"artifactLocation": _artifact(file, root),
                                 "region": {"startLine": max(line, 1)}}}


def _rule(kind: str) -> dict[str, Any]:
    short = _SHORT.get(kind, kind.replace("_", " "))
    fix = generic_fix(kind)
    return {
        "id": kind,
        "name": "".join(part.title() for part in kind.split("_")),
        "shortDescription": {"text": short},
        "fullDescription": {"text": f"{short}. {fix}".strip()},
        "help": {"text": fix or short, "markdown": f"**{short}.** {fix}".strip()},
        "defaultConfiguration": {"level": "error"},
        "properties": {"tags": ["correctness", "pytorch", "gradients"],
                       "precision": "high"},
    }


def _fallback_file(logs: Sequence[StepLog | LogReader], paths: list[str]) -> str:
    """The training script of the run (``argv[0]`` of a header, where it is a file here),
    else the first log."""
    for log in logs:
        argv = log.header.argv
        if argv and argv[0].endswith(".py") and Path(argv[0]).is_file():
            return argv[0]
    return paths[0]


def _fingerprint(f: Finding, w: Where | None) -> str:
    key = "|".join(map(str, (f.kind, f.optimizer, f.rank, f.worker,
                             w.function if w else "", w.line if w else "")))
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def _result(f: Finding, rule_index: int, root: Path, fallback: str) -> dict[str, Any]:
    main = primary(f)
    loc = (_location(main.file, main.line, root) if main else _location(fallback, 1, root))
    related = [dict(_location(w.file, w.line, root), id=i,
                    message={"text": f"{w.role} in {w.function}"})
               for i, w in enumerate(x for x in f.where if x is not main)]
    out: dict[str, Any] = {
        "ruleId": f.kind,
        "ruleIndex": rule_index,
        "level": "error",
        "message": {"text": f"{f.message} Fix: {f.fix}"},
        "locations": [loc],
        "partialFingerprints": {"gradwatchFinding/v1": _fingerprint(f, main)},
        "properties": {"optimizer": f.optimizer, "rank": f.rank, "worker": f.worker,
                       "first_step": f.first_step, "last_step": f.last_step,
                       "steps": f.steps, "params": f.params},
    }
    if related:
        out["relatedLocations"] = related
    return out


def sarif_log(findings: list[Finding], logs: Sequence[StepLog | LogReader],
              paths: list[str],
              nothing_judged: str | None = None) -> dict[str, Any]:
    """The SARIF log (a JSON-ready dict) of one run's findings.

    Args:
        findings: the run's findings.
        logs: the step logs judged (their headers name the training script).
        paths: the paths of those logs, as given.
        nothing_judged: why nothing was judged, if so: the invocation is then reported
            as not successful, with this reason.
    """
    root = repo_root()
    kinds = list(FINDING_KINDS) + sorted({f.kind for f in findings} - set(FINDING_KINDS))
    index = {k: i for i, k in enumerate(kinds)}
    fallback = _fallback_file(logs, paths)
    invocation: dict[str, Any] = {"executionSuccessful": nothing_judged is None}
    if nothing_judged:
        invocation["toolExecutionNotifications"] = [
            {"level": "error", "message": {"text": f"nothing judged: {nothing_judged}"}}]
    return {
        "$schema": SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": "gradwatch", "version": __version__,
                                "semanticVersion": __version__,
                                "rules": [_rule(k) for k in kinds]}},
            "originalUriBaseIds": {_BASE: {"uri": root.as_uri().rstrip("/") + "/"}},
            "invocations": [invocation],
            "results": [_result(f, index[f.kind], root, fallback) for f in findings],
        }],
    }
