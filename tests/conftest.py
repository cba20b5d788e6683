"""Fixtures for every test folder: a throwaway PostgreSQL cluster per test process; the
sharded launches that tests in two folders read. And the order tests are handed out in."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.pgcluster import Cluster, pg_bin

if TYPE_CHECKING:  # the launches import torch's test helpers: only when a test asks
    from tests.probe.sharded_launch import Launches


# Modules whose tests take seconds each (a browser, a server, torchrun, a bench, a `gradwatch
# run` or another torch process; 5-40 s under load), roughly the longest first. pytest-xdist
# (`--dist loadgroup`, scripts/test.sh) hands out the xdist_groups first, then single tests in
# collection order, a few to a worker at a time; a long test handed out last keeps one worker
# busy while the others have nothing left. Collected first, these run while the quick
# in-process tests are still queued to fill the end. Missing a module here costs time, never
# a result.
LONG_FIRST = (
    "web/", "e2e/", "bench/", "integrations/",
    "probe/test_probe_cli.py", "probe/test_probe_cli_lifecycle.py",
    "probe/test_probe_backward.py", "probe/test_torchrun.py", "probe/test_probe_where.py",
    "probe/test_probe_stops.py", "probe/test_probe_wrappers.py", "probe/test_names.py",
    "probe/test_hparams.py",
    "server/test_import_stream.py", "server/test_pg_holds.py", "server/test_downsampling.py",
    "server/test_fuzz.py", "server/test_pgpack.py", "server/test_postgres.py",
    "server/test_storage.py", "server/test_storage_hostile.py", "server/test_fanout.py",
    "server/test_no_torch.py", "server/test_parsing.py",
    "core/test_suite_groups.py", "core/test_dependencies.py", "core/test_check_cli.py",
)
TESTS = Path(__file__).resolve().parent


def _rank(item: pytest.Item) -> int:
    path = Path(item.path).resolve()
    where = path.relative_to(TESTS).as_posix() if path.is_relative_to(TESTS) else ""
    return next((i for i, p in enumerate(LONG_FIRST) if where.startswith(p)), len(LONG_FIRST))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A stable sort: each module's tests stay together and in their order.
    items.sort(key=_rank)


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
