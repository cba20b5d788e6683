"""``gradwatch check`` through the real command line: output, JSON contract, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.core.logs import clean_log, missed_reset_log, write


def check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gradwatch.cli", "check", *args],
                          capture_output=True, text=True, timeout=60)


def test_clean_log_exits_0(tmp_path: Path) -> None:
    r = check(str(write(tmp_path / "ok.jsonl", clean_log())))
    assert r.returncode == 0, r.stderr
    assert "0 findings" in r.stdout


def test_findings_exit_1_and_are_explained(tmp_path: Path) -> None:
    r = check(str(write(tmp_path / "bug.jsonl", missed_reset_log())))
    assert r.returncode == 1
    assert "missed_reset" in r.stdout and "first_step=1" in r.stdout
    assert "fix:" in r.stdout and "zero_grad" in r.stdout


def test_json_output_keeps_the_contract_keys(tmp_path: Path) -> None:
    r = check(str(write(tmp_path / "bug.jsonl", missed_reset_log())), "--json")
    assert r.returncode == 1
    out = json.loads(r.stdout)
    assert set(out) == {"findings", "summary"}
    [f] = out["findings"]
    assert {"kind", "optimizer", "first_step", "steps", "params", "message", "fix"} <= set(f)
    assert (f["kind"], f["optimizer"], f["first_step"], f["steps"]) == (
        "missed_reset", "SGD#0", 1, 3)
    assert out["summary"]["steps"] == 4


def test_invalid_log_exits_2_naming_the_line(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.jsonl", clean_log(3))
    lines = path.read_text().splitlines()
    lines[3] = "{oops"
    path.write_text("\n".join(lines) + "\n")
    r = check(str(path))
    assert r.returncode == 2
    assert "bad.jsonl:4" in r.stderr


def test_missing_file_and_bad_arguments_exit_2(tmp_path: Path) -> None:
    r = check(str(tmp_path / "absent.jsonl"))
    assert r.returncode == 2 and "cannot open" in r.stderr
    r = check("--frobnicate")
    assert r.returncode == 2 and "gradwatch check:" in r.stderr


def test_unknown_command_exits_2() -> None:
    r = subprocess.run([sys.executable, "-m", "gradwatch.cli", "chek"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "unknown command 'chek'" in r.stderr
