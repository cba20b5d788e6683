"""Where findings point: primary lines, fixes that name the lines, text and SARIF output of
findings that carry ``where`` (as the probe records them)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gradwatch.locations import located_fix, primary
from gradwatch.report import finding_lines
from gradwatch.sarif import sarif_log
from gradwatch.steplog import read_log
from gradwatch.wire import Finding, Where
from tests.core.logs import clean_log, header, write
from tests.core.sarif_shape import assert_sarif

LATE = """import torch
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(3):
    loss = model(torch.randn(4, 2)).sum()
    loss.backward()
    opt.zero_grad()
    opt.step()
"""


def _finding(kind: str, where: list[Where]) -> Finding:
    return Finding(kind=kind, optimizer="opt", first_step=0, last_step=2,  # type: ignore[arg-type]
                   steps=3, params=["weight"], message="m.", fix="generic", where=where)


@pytest.fixture
def late(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Where]:
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".git").mkdir()
    script = tmp_path / "late.py"
    script.write_text(LATE)
    f = str(script)
    return [Where(role="backward", file=f, line=6, function="<module>"),
            Where(role="reset", file=f, line=7, function="<module>"),
            Where(role="step", file=f, line=8, function="<module>")]


def test_the_fix_names_the_lines(late: list[Where]) -> None:
    fix = located_fix("late_reset", "opt", late, "optimizer_zero_grad")
    assert fix is not None and fix.startswith(
        "Move opt.zero_grad() at late.py:7 before loss.backward() at late.py:6 "
        "(or after opt.step() at late.py:8)")
    assert "p.grad = None at late.py:7" in (located_fix("late_reset", "opt", late,
                                                        "set_none") or "")
    missed = located_fix("missed_reset", "opt", [late[0], late[2]])
    assert missed is not None and missed.startswith(
        "Call opt.zero_grad() before loss.backward() at late.py:6 (or right after "
        "opt.step() at late.py:8)")
    assert "at late.py:7 after opt.step() at late.py:8" in (
        located_fix("discarded_accumulation", "opt", late, "optimizer_zero_grad") or "")
    assert "loss.backward() at late.py:6 left gradients" in (
        located_fix("cross_optimizer_leak", "opt", late) or "")
    # without the lines a fix needs, the generic fix stands
    assert located_fix("late_reset", "opt", [late[2]]) is None
    assert located_fix("missed_reset", "opt", []) is None


@pytest.mark.parametrize(("kind", "role"), [("late_reset", "reset"), ("missed_reset", "reset"),
                                            ("discarded_accumulation", "reset"),
                                            ("cross_optimizer_leak", "backward")])
def test_each_kind_points_at_its_primary_line(late: list[Where], kind: str, role: str) -> None:
    w = primary(_finding(kind, late))
    assert w is not None and w.role == role


def test_a_missed_reset_without_a_reset_points_at_the_backward_the_reset_goes_before(
        late: list[Where]) -> None:
    loop = [w for w in late if w.role != "reset"]  # step, then backward: the order matters not
    w = primary(_finding("missed_reset", sorted(loop, key=lambda x: x.role != "step")))
    assert w is not None and w.role == "backward"


def test_text_output_shows_the_lines_and_their_code(late: list[Where]) -> None:
    lines = finding_lines(_finding("late_reset", late))
    assert lines[1] == "  at: late.py:7  reset     in <module>: opt.zero_grad()"
    assert lines[2] == "      late.py:6  backward  in <module>: loss.backward()"
    assert lines[3] == "      late.py:8  step      in <module>: opt.step()"
    gone = _finding("late_reset", [Where(role="reset", file="/nowhere/x.py", line=3,
                                         function="f")])
    assert finding_lines(gone)[1] == "  at: /nowhere/x.py:3  reset     in f"


def test_sarif_result_sits_on_the_primary_line(late: list[Where], tmp_path: Path) -> None:
    log = read_log(write(tmp_path / "run.jsonl", clean_log(1), header()))
    outside = Where(role="step", file="/opt/elsewhere/lib.py", line=0, function="g")
    doc = sarif_log([_finding("late_reset", late), _finding("missed_reset", [outside])],
                    [log], [str(tmp_path / "run.jsonl")])
    assert_sarif(doc)
    first, second = doc["runs"][0]["results"]
    loc = first["locations"][0]["physicalLocation"]
    assert loc["artifactLocation"] == {"uri": "late.py", "uriBaseId": "%SRCROOT%"}
    assert loc["region"]["startLine"] == 7
    assert sorted(r["physicalLocation"]["region"]["startLine"]
                  for r in first["relatedLocations"]) == [6, 8]
    # outside the repository: an absolute file URI; line 0 (unknown) becomes line 1
    loc = second["locations"][0]["physicalLocation"]
    assert loc["artifactLocation"]["uri"] == "file:///opt/elsewhere/lib.py"
    assert loc["region"]["startLine"] == 1
    assert first["partialFingerprints"] != second["partialFingerprints"]
    assert os.path.isabs(doc["runs"][0]["originalUriBaseIds"]["%SRCROOT%"]["uri"][7:])
