"""``%load_ext gradwatch`` and ``%gradwatch on|off|status`` in IPython's own shell (no
notebook server): cells that train get a verdict; re-running the training cell without its
``zero_grad()`` is caught as a missed reset; cells that do not step print nothing."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("IPython")

from IPython.core.interactiveshell import InteractiveShell  # noqa: E402

from tests.integrations.conftest import judged  # noqa: E402

SETUP = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = torch.randn(32, 4), torch.randn(32, 1)
"""
TRAIN = """
for _ in range(5):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
"""
BROKEN = """
for _ in range(5):
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
"""


@pytest.fixture
def shell() -> Iterator[InteractiveShell]:
    ip = InteractiveShell.instance()
    yield ip
    ip.run_cell("%unload_ext gradwatch")
    InteractiveShell.clear_instance()


def run(ip: InteractiveShell, cell: str, capsys: pytest.CaptureFixture[str]) -> str:
    result = ip.run_cell(cell)
    out = capsys.readouterr().out
    assert result.success, (result.error_before_exec or result.error_in_exec, out)
    return out


def test_rerunning_a_training_cell_without_zero_grad_is_caught(
        shell: InteractiveShell, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    log = tmp_path / "nb.jsonl"
    run(shell, "%load_ext gradwatch", capsys)
    assert "on; watching every optimizer" in run(shell, f"%gradwatch on --log {log}", capsys)
    assert run(shell, SETUP, capsys) == ""  # no step, no verdict

    out = run(shell, TRAIN, capsys)
    assert out.strip() == "gradwatch: 5 optimizer steps in this cell, no gradient-reset bug found"

    out = run(shell, BROKEN, capsys)
    assert out.startswith("gradwatch: 5 optimizer steps in this cell, 1 finding:")
    assert "missed_reset on opt, from step 5 (5 steps)" in out  # step 5 re-reads step 4's
    # the fix names the cell's own lines (the backward and the step of the broken cell)
    # the reset of the earlier (clean) cell is the one to make run once per step
    assert re.search(r"fix: Make opt\.zero_grad\(\) at Cell In\[\d+\], line \d+ run once per "
                     r"step, right before loss\.backward\(\) at Cell In\[\d+\], line \d+", out), out
    # the parameters' names, from the model found in memory (prefixed with its class when
    # other models are alive too)
    assert re.search(r"params: (Sequential\.)?0\.weight, (Sequential\.)?0\.bias", out), out

    out = run(shell, BROKEN, capsys)  # the same slip again: reported as still happening
    assert "missed_reset on opt, from step 5 (10 steps) (again in this cell)" in out

    assert "5 optimizer steps in this cell, no gradient-reset bug" in run(shell, TRAIN, capsys)
    assert run(shell, "w = model[0].weight.sum()", capsys) == ""  # no step: silent

    status = run(shell, "%gradwatch status", capsys)
    assert status.startswith("gradwatch: on, 20 optimizer steps, 1 finding so far")

    out = run(shell, "%gradwatch off", capsys)
    assert out.startswith("gradwatch: off after 20 optimizer steps, 1 finding")
    v = judged(log)
    assert v.summary()["steps"] == 20 and v.summary()["status"] == "finished"
    assert [(f.kind, f.first_step, f.steps) for f in v.findings()] == [("missed_reset", 5, 10)]
    assert run(shell, TRAIN, capsys) == ""  # off: nothing is watched


def test_an_optimizer_made_before_on_is_judged_from_its_first_step(
        shell: InteractiveShell, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    run(shell, SETUP, capsys)
    run(shell, "%load_ext gradwatch", capsys)
    run(shell, f"%gradwatch on --log {tmp_path / 'nb.jsonl'}", capsys)
    out = run(shell, TRAIN, capsys)
    assert "5 optimizer steps in this cell, no gradient-reset bug found" in out


def test_the_dashboard_link_is_printed_with_a_server(
        shell: InteractiveShell, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    run(shell, "%load_ext gradwatch", capsys)
    # Nothing listens there: streaming retries in the background, the log is the buffer.
    out = run(shell, f"%gradwatch on --log {tmp_path / 'nb.jsonl'} --server "
                     f"ws://127.0.0.1:9 --name my-notebook", capsys)
    assert "dashboard: http://127.0.0.1:9/?run=" in out
    run(shell, SETUP, capsys)
    out = run(shell, TRAIN, capsys)
    assert "no gradient-reset bug found" in out and "dashboard: http://127.0.0.1:9/?run=" in out
    run(shell, "%gradwatch off", capsys)
    assert judged(tmp_path / "nb.jsonl").summary()["run_name"] == "my-notebook"


def test_wrong_lines_print_the_usage(shell: InteractiveShell,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    run(shell, "%load_ext gradwatch", capsys)
    assert "gradwatch: off" in run(shell, "%gradwatch", capsys)
    shell.run_cell("%gradwatch start")
    out = capsys.readouterr()
    assert "invalid choice: 'start'" in out.out + out.err
    assert "usage: %gradwatch on" in out.out + out.err
    shell.run_cell("%gradwatch on --server localhost:8765")
    out = capsys.readouterr()
    assert "server= must be a URL" in out.out + out.err
    assert "gradwatch: off" in run(shell, "%gradwatch status", capsys)


def test_without_log_the_step_log_is_named_after_the_run(
        shell: InteractiveShell, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    run(shell, "%load_ext gradwatch", capsys)
    run(shell, "%gradwatch on", capsys)  # the working directory is tmp_path (conftest)
    run(shell, SETUP + TRAIN, capsys)
    run(shell, "%gradwatch off", capsys)
    (log,) = tmp_path.glob("gradwatch-*.jsonl")
    assert log.name == f"gradwatch-{judged(log).summary()['run']}.jsonl"


def test_a_notebook_run_by_a_kernel_names_the_optimizer_and_the_cells(tmp_path: Path) -> None:
    """A real notebook, executed cell by cell by an IPython kernel (nbclient): the broken
    cell's finding names ``opt`` and the cell's lines as IPython's tracebacks do."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    cells = ["%load_ext gradwatch", f"%gradwatch on --log {tmp_path / 'nb.jsonl'}", SETUP,
             BROKEN]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    out = "".join(o.get("text", "") for o in nb.cells[3].outputs)
    assert "missed_reset on opt, from step 1 (4 steps)" in out, out
    count = nb.cells[3].execution_count
    assert re.search(rf"fix: Call opt\.zero_grad\(\) before loss\.backward\(\) at "
                     rf"Cell In\[{count}\], line 2 \(or right after opt\.step\(\) at "
                     rf"Cell In\[{count}\], line 3\)", out), out
    assert "ipykernel_" not in out
