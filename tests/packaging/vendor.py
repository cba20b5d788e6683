"""The vendored plotly.js bundle (web/vendor/) and its record, as the tests read them."""

from __future__ import annotations

import hashlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENDOR = ROOT / "web" / "vendor"
BUNDLE = VENDOR / "plotly.min.js"


def pin(vendor: Path = VENDOR) -> dict[str, str]:
    """``{"package": ..., "version": ...}`` from ``plotly.lock``."""
    lines = (vendor / "plotly.lock").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))


def recorded_sums(vendor: Path = VENDOR) -> dict[str, str]:
    """``{file name: sha256}`` from ``SHA256SUMS`` (``sha256sum`` output)."""
    return {name: digest for digest, name in
            (line.split() for line in (vendor / "SHA256SUMS").read_text().splitlines())}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
