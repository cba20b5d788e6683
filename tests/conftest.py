"""Fixtures for every test folder: a throwaway PostgreSQL cluster per test process; the
sharded launches that tests in two folders read."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests.pgcluster import Cluster, pg_bin

if TYPE_CHECKING:  # the launches import torch's test helpers: only when a test asks
    from tests.probe.sharded_launch import Launches


@pytest.fixture(scope="session")
def pg_installed() -> None:
    """PostgreSQL's programs are here (a test that starts a cluster itself asks for this):
    else the test is skipped, or fails in CI."""
    if pg_bin() is None:
        if os.environ.get("CI"):  # scripts/test.sh installs it: CI never skips these
            pytest.fail("PostgreSQL is not installed (scripts/test.sh installs it)")
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")


@pytest.fixture(scope="session")
def pg_cluster(pg_installed: None) -> Iterator[Cluster]:
    """A PostgreSQL cluster for this test process (one per xdist worker), stopped at the
    end of the session; each test makes a database of its own (``new_database``)."""
    c = Cluster()
    yield c
    c.stop()


@pytest.fixture(scope="session")
def sharded_launches(tmp_path_factory: pytest.TempPathFactory) -> Launches:
    """The two torchrun launches of the sharded scenarios (``tests/probe/sharded_launch.py``),
    made once for the tests of ``tests/probe/test_sharded.py`` and
    ``tests/e2e/test_sharded_server.py`` (one xdist_group: one worker makes them)."""
    from tests.probe.sharded_launch import launch_both

    return launch_both(tmp_path_factory.mktemp("sharded"))
