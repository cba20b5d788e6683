"""Fixtures for server tests: an app on a temporary data directory."""

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


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """A started storage writer on ``tmp_path``, closed after the test."""
    s = Store(tmp_path)
    s.start()
    yield s
    s.close()
