"""The suite's own scheduling: tests that share an expensive fixture (the built wheel, the
Docker engine, a two-rank run) are one ``xdist_group`` and must run on one worker, or each
worker builds the fixture again and one worker's teardown stops what the other still uses
(a Docker engine once). A pytest and pytest-xdist pair that breaks groups fails here."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("xdist")

SAMPLE = '''
import pytest
pytestmark = pytest.mark.xdist_group("shared")

@pytest.mark.parametrize("i", range(6))
def test_grouped(i):
    pass

@pytest.mark.parametrize("i", range(6))
@pytest.mark.xdist_group("other")
def test_other(i):
    pass
'''


def test_an_xdist_group_runs_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v",
                        "-n", "2", "--dist", "loadgroup", "-p", "no:randomly", "test_sample.py"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    ran = re.findall(r"\[(gw\d+)\].*PASSED test_sample\.py::(test_\w+)", r.stdout)
    assert len(ran) == 12, r.stdout[-2000:]
    for name in ("test_grouped", "test_other"):
        workers = {w for w, test in ran if test == name}
        assert len(workers) == 1, f"{name} ran on {sorted(workers)}: xdist groups are split"


def test_the_modules_handed_out_first_exist() -> None:
    # tests/conftest.py collects these first, so that the long tests are not the last ones
    # handed out: a renamed or moved module would silently drop to the end of the run.
    from tests.conftest import LONG_FIRST, TESTS

    assert [p for p in LONG_FIRST if not (TESTS / p).exists()] == []
