"""Fixtures for every test folder: a throwaway PostgreSQL cluster per test process."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.pgcluster import Cluster, pg_bin


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
