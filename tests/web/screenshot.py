"""Regenerate the README's screenshot (docs/dashboard.png): the demo run at 1280×720.

    python -m tests.web.screenshot [--out docs/dashboard.png]

Runs ``gradwatch demo --once`` (the demo training, no pacing) into a temporary data
directory, serves it with ``gradwatch serve`` and photographs the run's page in Debian's
Chromium once its chart and parameter heatmap are drawn. Needs torch (the demo trains).
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.serverproc import ServerProc, free_port
from tests.web.conftest import CHROMIUM, CHROMIUM_ARGS

ROOT = Path(__file__).resolve().parents[2]
SIZE = {"width": 1280, "height": 720}


async def shoot(url: str, out: Path) -> None:
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = await browser.new_page(viewport=SIZE)
        await page.goto(url)
        await page.wait_for_function(
            "window.Plotly && ['chart', 'heatmap'].every(id => "
            "(document.getElementById(id)._fullData || []).length > 0)", timeout=30_000)
        await page.wait_for_timeout(500)  # the band shading is redrawn at most once a second
        await page.screenshot(path=str(out))
        await browser.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "dashboard.png")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="gw-shot-") as d:
        data = Path(d) / "data"
        subprocess.run([sys.executable, "-m", "gradwatch.cli", "demo", "--once", "--pace", "0",
                        "--port", str(free_port()), "--data", str(data)], check=True,
                       stdout=subprocess.DEVNULL)
        with ServerProc(data) as srv:
            run = srv.get("/api/runs")["runs"][0]["id"]
            asyncio.run(shoot(f"{srv.http}/?run={run}", args.out))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
