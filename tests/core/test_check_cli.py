"""``gradwatch check`` through the real command line: output, JSON and SARIF, several logs of
one run, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gradwatch.wire import FINDING_KINDS
from tests.core.logs import clean_log, header, missed_reset_log, no_step_log, write
from tests.core.sarif_shape import assert_sarif

CONTRACT_KEYS = {"kind", "optimizer", "first_step", "last_step", "steps", "params", "message",
                 "fix", "rank", "where"}


def check(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gradwatch.cli", "check", *args],
                          capture_output=True, text=True, timeout=60, cwd=cwd)


def test_clean_log_exits_0(tmp_path: Path) -> None:
    r = check(str(write(tmp_path / "ok.jsonl", clean_log())))
    assert r.returncode == 0, r.stderr
    assert "0 findings" in r.stdout


def test_findings_exit_1_and_are_explained(tmp_path: Path) -> None:
    r = check(str(write(tmp_path / "bug.jsonl", missed_reset_log())))
    assert r.returncode == 1
    assert "missed_reset on SGD#0, from step 1" in r.stdout
    assert "fix:" in r.stdout and "zero_grad" in r.stdout


@pytest.mark.parametrize("flag", [["--json"], ["--format", "json"], ["--format=json"]])
def test_json_output_keeps_the_contract_keys(tmp_path: Path, flag: list[str]) -> None:
    r = check(str(write(tmp_path / "bug.jsonl", missed_reset_log())), *flag)
    assert r.returncode == 1
    out = json.loads(r.stdout)
    assert set(out) == {"findings", "summary"}
    [f] = out["findings"]
    assert set(f) >= CONTRACT_KEYS
    assert (f["kind"], f["optimizer"], f["first_step"], f["steps"], f["rank"], f["where"]) == (
        "missed_reset", "SGD#0", 1, 3, 0, [])
    assert out["summary"]["steps"] == 4 and out["summary"]["nothing_judged"] is None


def test_the_optimizers_label_names_it_in_findings(tmp_path: Path) -> None:
    recs = missed_reset_log()
    recs[0] = recs[0].model_copy(update={"label": "dec_opt"})
    r = check(str(write(tmp_path / "bug.jsonl", recs)), "--json")
    [f] = json.loads(r.stdout)["findings"]
    assert f["optimizer"] == "dec_opt" and f["message"].startswith("dec_opt re-applied")
    assert json.loads(r.stdout)["summary"]["optimizers"] == ["dec_opt"]


def test_json_and_another_format_together_is_a_usage_error(tmp_path: Path) -> None:
    r = check(str(write(tmp_path / "ok.jsonl", clean_log())), "--json", "--format", "sarif")
    assert r.returncode == 2 and "--json and --format sarif disagree" in r.stderr


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
    r = check(str(write(tmp_path / "ok.jsonl", clean_log())), "--format", "xml")
    assert r.returncode == 2 and "invalid choice: 'xml'" in r.stderr


def test_unknown_command_exits_2() -> None:
    r = subprocess.run([sys.executable, "-m", "gradwatch.cli", "chek"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "unknown command 'chek'" in r.stderr


# ------------------------------------------------------------------ one run, every rank
def _ranks(tmp_path: Path, run1: str = "job", run2: str = "job") -> tuple[Path, Path]:
    r0 = write(tmp_path / "job.rank0.jsonl", clean_log(4),
               header(run1, rank=0, world_size=2))
    r1 = write(tmp_path / "job.rank1.jsonl", missed_reset_log(),
               header(run2, rank=1, world_size=2))
    return r0, r1


def test_the_logs_of_a_runs_ranks_are_judged_together(tmp_path: Path) -> None:
    r0, r1 = _ranks(tmp_path)
    r = check(str(r0), str(r1))
    assert r.returncode == 1, r.stderr
    assert "run 'demo' (2 logs): 8 optimizer steps, 1 finding" in r.stdout
    assert "rank 0: 4 steps, finished" in r.stdout
    assert "missed_reset on SGD#0, from step 1 (3 steps), rank 1" in r.stdout
    out = json.loads(check(str(r0), str(r1), "--json").stdout)
    assert [(f["kind"], f["rank"]) for f in out["findings"]] == [("missed_reset", 1)]
    assert [(s["rank"], s["steps"]) for s in out["summary"]["streams"]] == [(0, 4), (1, 4)]
    # the clean rank alone passes; the same file twice counts once
    assert check(str(r0), str(r0)).returncode == 0


def test_logs_of_different_runs_are_refused(tmp_path: Path) -> None:
    r0, r1 = _ranks(tmp_path, "job", "other")
    r = check(str(r0), str(r1))
    assert r.returncode == 2
    assert "different runs" in r.stderr and "'job'" in r.stderr and "'other'" in r.stderr
    assert r.stdout == ""


def test_two_logs_of_the_same_rank_are_refused(tmp_path: Path) -> None:
    r0, _ = _ranks(tmp_path)
    copy = tmp_path / "copy.jsonl"
    copy.write_text(r0.read_text())
    r = check(str(r0), str(copy))
    assert r.returncode == 2 and "are both rank 0 of run 'job'" in r.stderr


def test_worker_streams_are_told_apart(tmp_path: Path) -> None:
    main = write(tmp_path / "h.jsonl", no_step_log(), header("hog"))
    w1 = write(tmp_path / "h.worker1.jsonl", clean_log(3), header("hog", worker=1))
    w2 = write(tmp_path / "h.worker2.jsonl", missed_reset_log(), header("hog", worker=2))
    r = check(str(main), str(w1), str(w2))
    assert r.returncode == 1, r.stderr
    assert ", worker 2" in r.stdout and "made no optimizer step" not in r.stdout
    [f] = json.loads(check(str(main), str(w1), str(w2), "--json").stdout)["findings"]
    assert (f["rank"], f["worker"]) == (0, 2)


# ------------------------------------------------------------------ nothing judged: exit 3
@pytest.mark.parametrize(("status", "code", "reason"), [
    ("finished", 0, "no optimizer step in the log: the run never stepped an optimizer"),
    ("failed", 1, "the run failed before its first optimizer step (exit code 1)"),
    (None, None, "no optimizer step in the log, and it has no end record"),
])
def test_nothing_judged_exits_3_saying_why(tmp_path: Path, status: str | None,
                                           code: int | None, reason: str) -> None:
    log = write(tmp_path / "idle.jsonl", no_step_log(status, code))
    r = check(str(log))
    assert r.returncode == 3, r.stdout + r.stderr
    assert reason in r.stdout and f"nothing judged: {reason}" in r.stderr
    j = check(str(log), "--json")
    assert j.returncode == 3 and reason in json.loads(j.stdout)["summary"]["nothing_judged"]
    s = check(str(log), "--format", "sarif")
    assert s.returncode == 3
    [inv] = json.loads(s.stdout)["runs"][0]["invocations"]
    assert inv["executionSuccessful"] is False
    assert reason in inv["toolExecutionNotifications"][0]["message"]["text"]


def test_a_rank_that_stepped_is_enough_to_judge(tmp_path: Path) -> None:
    r0 = write(tmp_path / "a.rank0.jsonl", clean_log(3), header("j", rank=0, world_size=2))
    r1 = write(tmp_path / "a.rank1.jsonl", no_step_log(), header("j", rank=1, world_size=2))
    r = check(str(r0), str(r1))
    assert r.returncode == 0 and "note: rank 1 made no optimizer step" in r.stdout


def test_a_run_that_failed_after_steps_is_judged(tmp_path: Path) -> None:
    recs = clean_log(3)
    recs[-1] = recs[-1].model_copy(update={"status": "failed", "exit_code": 1})
    r = check(str(write(tmp_path / "f.jsonl", recs)))
    assert r.returncode == 0 and "note: the run ended failed" in r.stdout


# ------------------------------------------------------------------ SARIF
def test_sarif_output_is_one_result_per_finding(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()  # the repository root URIs are relative to
    (tmp_path / "src").mkdir()
    script = tmp_path / "src" / "train.py"
    script.write_text("print('training')\n")
    hdr = header(argv=["src/train.py", "--epochs", "3"])
    log = write(tmp_path / "bug.jsonl", missed_reset_log(), hdr)
    r = check(str(log), "--format", "sarif", cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert_sarif(doc)
    run = doc["runs"][0]
    assert [rule["id"] for rule in run["tool"]["driver"]["rules"]] == list(FINDING_KINDS)
    assert all(rule["help"]["text"] for rule in run["tool"]["driver"]["rules"])
    [res] = run["results"]
    assert res["ruleId"] == "missed_reset" and res["level"] == "error"
    assert res["message"]["text"].startswith("SGD#0 re-applied")
    # no line recorded: the result sits on the script that ran, relative to the repo root
    art = res["locations"][0]["physicalLocation"]["artifactLocation"]
    assert (art["uri"], art["uriBaseId"]) == ("src/train.py", "%SRCROOT%")
    assert run["originalUriBaseIds"]["%SRCROOT%"]["uri"] == tmp_path.resolve().as_uri() + "/"
    assert check(str(write(tmp_path / "ok.jsonl", clean_log())), "--format", "sarif",
                 cwd=tmp_path).returncode == 0


def test_a_log_read_from_a_pipe_is_judged_to_its_end(tmp_path: Path) -> None:
    # check <(zcat run.jsonl.gz): the pipe has a writer; read it to the end, no error
    text = write(tmp_path / "run.jsonl", missed_reset_log()).read_text()
    r = subprocess.run([sys.executable, "-m", "gradwatch.cli", "check", "/dev/stdin"],
                       input=text, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "missed_reset" in r.stdout, r.stderr
