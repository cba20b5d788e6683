"""What a web page can do to a gradwatch server on the visitor's machine, in a real Chromium.

Every page here is the attacker's: one on a name rebound to 127.0.0.1 (DNS rebinding), and
one on another site that posts to the server. Neither may read, change or watch runs.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from gradwatch.steplog import dumps_log
from tests.serverproc import ServerProc

from .conftest import Page
from .dash import header, ingest, optimizer, steps

pytestmark = pytest.mark.browser

EVIL = "evil.example"
ATTACKER = (f"--host-resolver-rules=MAP {EVIL} 127.0.0.1",
            "--disable-features=LocalNetworkAccessChecks")
"""Chromium resolves the attacker's name to this machine, as a rebound DNS answer does, and
lets a public page reach this machine, as Firefox, Safari, older Chromes and a Chrome whose
user clicked "allow" on its local-network prompt do: the server must hold on its own."""


async def _attacker_page(page: Page, url: str) -> None:
    """Open ``url`` as the attacker's page (served by the attacker, before any rebinding)."""

    async def serve(route: Any) -> None:
        await route.fulfill(status=200, content_type="text/html",
                            body="<!doctype html><title>cute cats</title>")

    await page.route(url, serve)
    await page.goto(url)


@pytest.mark.chromium_args(*ATTACKER)
async def test_a_rebound_name_cannot_read_delete_or_watch_runs(
        server: ServerProc, page: Page) -> None:
    await ingest(server.ws, "victim", [header("victim", "secret run"), optimizer(),
                                       *steps(10)])
    await _attacker_page(page, f"http://{EVIL}:{server.port}/cats.html")
    # Same origin as far as the browser knows: evil.example:PORT is now 127.0.0.1:PORT.
    got = await page.evaluate("""async () => {
        const runs = await fetch('/api/runs');
        const del = await fetch('/api/runs/victim', {method: 'DELETE'});
        const ws = await new Promise((resolve) => {
            const s = new WebSocket(`ws://${location.host}/ws/live`);
            s.onmessage = (ev) => { resolve('read: ' + ev.data.slice(0, 60)); s.close(); };
            s.onclose = (ev) => resolve('closed ' + ev.code);
        });
        return {runs: [runs.status, await runs.text()], del: del.status, ws};
    }""")
    status, body = got["runs"]
    assert status == 403 and "victim" not in body
    assert f"'{EVIL}:{server.port}'" in json.loads(body)["detail"]
    assert got["del"] == 403
    assert got["ws"].startswith("closed"), got["ws"]
    assert server.get("/api/runs/victim")["steps"] == 10  # still there, untouched


@pytest.mark.chromium_args(*ATTACKER)
async def test_a_page_on_another_site_cannot_plant_runs(
        server: ServerProc, page: Page) -> None:
    log = dumps_log(header("planted", "planted"), [optimizer(), *steps(5)])
    target = f"http://127.0.0.1:{server.port}/api/runs/import"
    await _attacker_page(page, f"http://{EVIL}/cats.html")
    # The "simple" requests a page may send anywhere without asking: text/plain, a Blob
    # without a type, multipart (fetch and a plain form), and from a sandboxed frame
    # (Origin: null).
    await page.evaluate("""async ([target, log]) => {
        const send = (init) => fetch(target, {method: 'POST', mode: 'no-cors', ...init})
            .catch(() => null);
        await send({body: log, headers: {'Content-Type': 'text/plain'}});
        await send({body: new Blob([log])});
        const fd = new FormData();
        fd.append('file', new Blob([log]), 'run.jsonl');
        await send({body: fd});
        const frame = document.createElement('iframe');
        frame.name = 'sink';
        document.body.append(frame);
        const form = document.createElement('form');
        Object.assign(form, {action: target, method: 'post', target: 'sink',
                             enctype: 'multipart/form-data'});
        const area = document.createElement('textarea');
        Object.assign(area, {name: 'file', value: log});
        form.append(area);
        document.body.append(form);
        const loaded = new Promise((r) => { frame.onload = r; });
        form.submit();
        await loaded;
        const boxed = document.createElement('iframe');
        boxed.sandbox = 'allow-scripts';
        boxed.srcdoc = `<script>fetch(${JSON.stringify(target)}, {method: 'POST',
            mode: 'no-cors', body: ${JSON.stringify(log)}})<\\/script>`;
        document.body.append(boxed);
    }""", [target, log])
    await asyncio.sleep(1.0)  # the sandboxed frame's request
    assert server.get("/api/runs") == {"runs": []}
    assert "refused POST /api/runs/import" in server.log.read_text()
