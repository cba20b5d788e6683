"""Fixtures for server tests: an app on a temporary data directory; storage over both
backends (SQLite in a temporary directory, a database of its own on the throwaway
PostgreSQL cluster of ``tests/conftest.py``)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

sys.path.insert(0, str(Path(__file__).parent))

from apps import app_settings  # noqa: E402

from gradwatch.server import Settings, create_app  # noqa: E402
from gradwatch.server.storage import Store  # noqa: E402


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return app_settings(data_dir=tmp_path / "data", interrupted_after=0.2)


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as c:
        yield c


@pytest.fixture(params=["sqlite", "postgresql"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    """Where a test's storage lives, once per backend: a data directory (SQLite) or the
    URL of a new, empty PostgreSQL database."""
    if request.param == "sqlite":
        return tmp_path
    return str(request.getfixturevalue("pg_cluster").new_database())


@pytest.fixture
def store(where: Path | str) -> Iterator[Store]:
    """A started storage writer on ``where`` (each backend), closed after the test."""
    s = Store(where)
    s.start()
    yield s
    s.close()


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Store]:
    """A started storage writer on SQLite in ``tmp_path`` (for what only a file shows)."""
    s = Store(tmp_path)
    s.start()
    yield s
    s.close()
