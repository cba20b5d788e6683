"""plotly.js is vendored: the pinned bundle, its licence, and the script that refreshes it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from .vendor import BUNDLE, ROOT, VENDOR, pin, recorded_sums, sha256

SCRIPT = ROOT / "scripts" / "refresh-plotly.sh"


def test_the_vendored_files_are_the_recorded_ones() -> None:
    sums = recorded_sums()
    assert set(sums) == {"plotly.min.js", "LICENSE-plotly.js"}
    for name, digest in sums.items():
        assert sha256(VENDOR / name) == digest, f"web/vendor/{name} differs from SHA256SUMS"


def test_the_bundle_is_the_pinned_package_and_version() -> None:
    p = pin()
    banner = BUNDLE.read_text(encoding="utf-8")[:200].splitlines()[1]
    flavour = p["package"].removeprefix("plotly.js-").removesuffix("-dist-min")
    assert banner == f"* plotly.js ({flavour} - minified) v{p['version']}"
    licence = (VENDOR / "LICENSE-plotly.js").read_text()
    assert licence.startswith("MIT License") and "Plotly" in licence


@pytest.mark.skipif(shutil.which("npm") is None, reason="npm not installed")
def test_the_refresh_script_fetches_the_pin_and_refuses_other_bytes(tmp_path: Path) -> None:
    good, bad = tmp_path / "good", tmp_path / "bad"
    for out in (good, bad):
        out.mkdir()
        shutil.copy(VENDOR / "plotly.lock", out)
        shutil.copy(VENDOR / "SHA256SUMS", out)
    r = subprocess.run(["bash", str(SCRIPT), "--out", str(good)], capture_output=True,
                       text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    assert (good / "plotly.min.js").read_bytes() == BUNDLE.read_bytes()
    assert (good / "LICENSE-plotly.js").read_bytes() == (VENDOR / "LICENSE-plotly.js").read_bytes()

    sums = (VENDOR / "SHA256SUMS").read_text()
    digest = recorded_sums()["plotly.min.js"]
    (bad / "SHA256SUMS").write_text(sums.replace(digest, "0" * 64))
    r = subprocess.run(["bash", str(SCRIPT), "--out", str(bad)], capture_output=True,
                       text=True, timeout=180)
    assert r.returncode == 1
    assert "does not match" in r.stderr
    assert not (bad / "plotly.min.js").exists()
