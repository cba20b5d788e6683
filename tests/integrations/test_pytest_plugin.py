"""``pytest --gradwatch`` (the plugin of the ``pytest11`` entry point), run by ``pytester``
on small test files that train: off unless asked; a passing training test stays green; a
test that forgets ``zero_grad`` fails with the finding and its fix."""

from __future__ import annotations

import pytest
import torch  # noqa: F401

# In-process runs drop the modules they imported afterwards; torch must not be imported
# twice in one process, so it (and the probe) are imported here, outside them.
import gradwatch.integrations.sessions  # noqa: F401
import gradwatch.probe.api  # noqa: F401

pytest_plugins = ["pytester"]

QUIET = ("-p", "no:cacheprovider", "-p", "no:asyncio", "-p", "no:hypothesispytest",
         "-p", "no:anyio")

TESTS = '''
import pytest
import torch


def train(steps, reset=True):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for i in range(steps):
        if reset:
            opt.zero_grad()
        loss = model(torch.randn(16, 4)).pow(2).mean()
        loss.backward()
        opt.step()
    return loss.item()


def test_trains_cleanly():
    assert train(5) < 10


def test_forgets_zero_grad():
    assert train(5, reset=False) < 10


@pytest.mark.no_gradwatch
def test_breaks_training_on_purpose():
    train(5, reset=False)


def test_fails_on_its_own_and_forgets_zero_grad():
    train(3, reset=False)
    assert 1 == 2, "the test's own failure"


@pytest.fixture
def trained():  # fixtures run inside the test's watch session
    return train(4)


def test_the_model_a_fixture_trained_is_judged_too(trained):
    assert trained < 10
'''


def test_off_unless_asked(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_train=TESTS)
    result = pytester.runpytest_subprocess(*QUIET)
    result.assert_outcomes(passed=4, failed=1)  # only the test's own failure
    assert "gradwatch:" not in result.stdout.str()  # (the plugin is listed, and idle)


def test_gradwatch_fails_the_test_that_forgot_zero_grad(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_train=TESTS)
    base = pytester.path / "basetemp"
    result = pytester.runpytest_subprocess("--gradwatch", *QUIET, "-rA", f"--basetemp={base}")
    result.assert_outcomes(passed=3, failed=2)
    out = result.stdout.str()
    result.stdout.fnmatch_lines([
        "*FAILED test_train.py::test_forgets_zero_grad*",
        "*FAILED test_train.py::test_fails_on_its_own_and_forgets_zero_grad*",
    ])
    for name in ("test_trains_cleanly", "test_breaks_training_on_purpose",
                 "test_the_model_a_fixture_trained_is_judged_too"):
        assert f"PASSED test_train.py::{name}" in out
    # the finding, its fix and the step log, in the failing test's report
    section = out[out.index("_ test_forgets_zero_grad _"):]
    assert "gradwatch: this test stepped on 1 gradient-reset bug" in section
    assert "missed_reset on opt, from step 1 (4 steps)" in section
    # the fix names the test's own lines: the backward and the step
    assert ("fix: Call opt.zero_grad() before loss.backward() at test_train.py:13 "
            "(or right after opt.step() at test_train.py:14)") in section
    assert "params: 0.weight, 0.bias, 2.weight, 2.bias" in section
    # a test that fails on its own keeps its error; the findings come as a section
    own = out[out.index("_ test_fails_on_its_own_and_forgets_zero_grad _"):]
    assert "the test's own failure" in own
    assert "Captured gradwatch call" in own and "missed_reset on opt" in own

    # each watched test has its own step log in pytest's temporary directory
    logs = sorted(p.parent.name for p in base.glob("gradwatch-*/steps.jsonl")
                  if not p.parent.is_symlink())  # pytest links the latest as "...current"
    assert logs == ["gradwatch-test_fails_on_its_own_and_forgets_zero_g0",
                    "gradwatch-test_forgets_zero_grad0",
                    "gradwatch-test_the_model_a_fixture_trained_is_judg0",
                    "gradwatch-test_trains_cleanly0"]
    from gradwatch.steplog import read_log
    from gradwatch.verdict import verdict_of

    log = read_log(base / "gradwatch-test_the_model_a_fixture_trained_is_judg0" / "steps.jsonl")
    v = verdict_of([log.header, *log.records])
    assert v.summary()["steps"] == 4 and v.findings() == []  # the fixture's steps too
    assert log.header.run_name == "test_train.py::test_the_model_a_fixture_trained_is_judged_too"


def test_a_finding_with_recorded_lines_names_them() -> None:
    """The plugin reports a finding as check does: heading, its lines, params, message, fix."""
    from gradwatch.report import finding_lines
    from gradwatch.wire import Finding, Where

    f = Finding(
        kind="late_reset", optimizer="AdamW#0", first_step=0, last_step=2, steps=3,
        params=["w"], message="AdamW#0 stepped with no fresh gradient.",
        fix="Move zero_grad() out.",
        where=[Where(role="reset", file="/elsewhere/train.py", line=12, function="main"),
               Where(role="step", file="/elsewhere/train.py", line=13, function="main")])
    assert finding_lines(f) == [
        "late_reset on AdamW#0, from step 0 (3 steps)",
        "  at: /elsewhere/train.py:12  reset     in main",
        "      /elsewhere/train.py:13  step      in main",
        "  params: w",
        "  AdamW#0 stepped with no fresh gradient.",
        "  fix: Move zero_grad() out.",
    ]
