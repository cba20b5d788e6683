"""Who may talk to the server: Host (DNS rebinding), Origin and cross-site writes, token."""

from __future__ import annotations

from pathlib import Path

import pytest
import synth
from apps import TESTCLIENT_HOST, app_settings
from fastapi.testclient import TestClient
from starlette.testclient import WebSocketDenialResponse

from gradwatch.frames import Hello
from gradwatch.server import Settings, create_app
from gradwatch.server.security import host_name, host_ok, write_refusal

LOG = synth.log_text(synth.records(steps=5))
NDJSON = {"content-type": "application/x-ndjson"}


@pytest.mark.parametrize(("header", "name"), [
    ("127.0.0.1:8765", "127.0.0.1"), ("LOCALHOST.:80", "localhost"), ("[::1]:8765", "::1"),
    ("evil.example", "evil.example"), ("[::1", None), ("127.0.0.1:port", None),
    ("user@127.0.0.1", None), ("127.0.0.1/x", None), ("", None), ("a b", None),
])
def test_host_name_of_a_host_header(header: str, name: str | None) -> None:
    assert host_name(header) == name


@pytest.mark.parametrize(("host", "ok"), [
    ("127.0.0.1:8765", True), ("localhost:8765", True), ("localhost", True),
    ("[::1]:8765", True), ("127.4.5.6:1", True), (None, True),
    ("evil.example:8765", False), ("evil.example", False), ("0.0.0.0:8765", False),
    ("127.0.0.1.evil.example:8765", False), ("localhost.evil.example", False),
    ("192.168.1.5:8765", False), ("", False),
])
def test_only_loopback_names_are_accepted_by_default(host: str | None, ok: bool) -> None:
    assert host_ok(Settings(), host) is ok


def test_allowed_names_the_bind_address_and_a_token_widen_the_host_rule() -> None:
    assert host_ok(Settings(allowed_hosts=("GW.lan",)), "gw.lan:80")
    assert not host_ok(Settings(allowed_hosts=("gw.lan",)), "other.lan")
    assert host_ok(Settings(allowed_hosts=("*",)), "anything.example")
    assert host_ok(Settings(host="10.1.2.3"), "10.1.2.3:8765")
    assert not host_ok(Settings(host="0.0.0.0"), "0.0.0.0:8765")  # a wildcard is no name
    assert host_ok(Settings(token="t"), "evil.example:8765")  # the page has no token


@pytest.mark.parametrize(("method", "headers", "ok"), [
    ("GET", {"origin": "http://evil.example"}, True),  # reads: the browser hides answers
    ("POST", {"origin": "http://evil.example", "host": "h:1"}, False),
    ("POST", {"origin": "null", "host": "h:1"}, False),
    ("POST", {"origin": "http://h:1", "host": "h:1"}, True),
    ("POST", {"origin": "https://h:1", "host": "h:1"}, True),
    ("POST", {"origin": "http://h:2", "host": "h:1"}, False),  # another port: another site
    ("POST", {}, False),
    ("POST", {"content-type": "text/plain;charset=UTF-8"}, False),
    ("POST", {"content-type": "multipart/form-data; boundary=x"}, False),
    ("POST", {"content-type": "application/x-www-form-urlencoded"}, False),
    ("POST", {"content-type": "application/x-ndjson"}, True),
    ("POST", {"content-type": "application/json"}, True),
    ("POST", {"content-type": "text/plain", "x-gradwatch": "1"}, True),
    ("DELETE", {}, True),  # a page's DELETE always carries an Origin
    ("DELETE", {"origin": "http://evil.example", "host": "h:1"}, False),
])
def test_the_cross_site_write_rule(method: str, headers: dict[str, str], ok: bool) -> None:
    assert (write_refusal(Settings(), method, headers) is None) is ok


def test_a_foreign_host_is_refused_on_every_route_and_socket(tmp_path: Path) -> None:
    with TestClient(create_app(Settings(data_dir=tmp_path))) as client:
        for method, path in (("GET", "/api/runs"), ("GET", "/"), ("GET", "/healthz"),
                             ("GET", "/static/js/api.js"), ("DELETE", "/api/runs/x")):
            r = client.request(method, path, headers={"host": "evil.example:8765"})
            assert r.status_code == 403, (method, path)
            assert "'evil.example:8765'" in r.json()["detail"]
            assert "--allow-host" in r.json()["detail"]
        assert client.get("/api/runs", headers={"host": "127.0.0.1:8765"}).json() == \
            {"runs": []}
        for path in ("/ws/live", "/ws/ingest"):  # TestClient's sockets say Host: testserver
            with pytest.raises(WebSocketDenialResponse) as e, client.websocket_connect(path):
                pass
            assert e.value.status_code == 403 and b"DNS rebinding" in e.value.content


@pytest.mark.parametrize("path", ["/ws/live", "/ws/ingest"])
def test_a_foreign_origin_cannot_open_a_socket(client: TestClient, path: str) -> None:
    for origin in ("http://evil.example", "null"):
        with pytest.raises(WebSocketDenialResponse) as e, \
                client.websocket_connect(path, headers={"origin": origin}):
            pass
        assert e.value.status_code == 403 and b"--allow-origin" in e.value.content
    with client.websocket_connect(path, headers={"origin": f"http://{TESTCLIENT_HOST}"}) as ws:
        ws.send_text(Hello(run="x").model_dump_json())  # same origin: fine


def test_a_web_page_cannot_import_or_delete_runs(tmp_path: Path) -> None:
    s = app_settings(data_dir=tmp_path, max_runs=3, allowed_origins=("http://dash.example",))
    with TestClient(create_app(s)) as client:
        evil = {"origin": "http://evil.example"}
        attempts = [
            {"content": LOG, "headers": {**evil, "content-type": "text/plain"}},
            {"content": LOG, "headers": {"origin": "null", "content-type": "text/plain"}},
            {"content": LOG, "headers": {**evil, **NDJSON}},
            {"content": LOG, "headers": {"content-type": "text/plain"}},  # Origin stripped
            {"content": LOG},
            {"files": {"file": ("run.jsonl", LOG.encode())}},
        ]
        for _ in range(2):  # enough to fill the run limit, were any of them taken
            for kw in attempts:
                r = client.post("/api/runs/import", **kw)  # type: ignore[arg-type]
                assert r.status_code == 403, (kw.get("headers"), r.text)
                assert r.json()["detail"]
        assert client.get("/api/runs").json() == {"runs": []}
        # What a user's tools send is taken: curl's non-form type, a marked form, a page of
        # the server's own origin or an allowed one.
        for kw in ({"content": LOG, "headers": NDJSON},
                   {"files": {"file": ("run.jsonl", LOG.encode())},
                    "headers": {"x-gradwatch": "1"}},
                   {"content": LOG, "headers": {"origin": f"http://{TESTCLIENT_HOST}",
                                                "content-type": "text/plain"}}):
            assert client.post("/api/runs/import", **kw).status_code == 201  # type: ignore[arg-type]
        r = client.post("/api/runs/import", content=LOG,
                        headers={"origin": "http://dash.example", **NDJSON})
        assert r.status_code == 429  # allowed, but the run limit (3) is reached
        assert client.delete("/api/runs/run1", headers=evil).status_code == 403
        assert client.get("/api/runs/run1").status_code == 200
        assert client.delete("/api/runs/run1").status_code == 204


def test_token_by_header_cookie_or_query_and_the_page_url_drops_it(tmp_path: Path) -> None:
    s = Settings(data_dir=tmp_path, token="s3cret")  # any Host: the token is the guard
    with TestClient(create_app(s)) as client:
        assert client.get("/healthz").status_code == 200
        assert client.get("/static/vendor/plotly.min.js").status_code == 200
        for path in ("/api/runs", "/", "/openapi.json", "/api/schema"):
            r = client.get(path)
            assert r.status_code == 401 and "token" in r.json()["detail"]
        bearer = {"Authorization": "Bearer s3cret"}
        assert client.get("/api/runs", headers=bearer).json() == {"runs": []}
        assert client.get("/api/runs?token=s3cret").status_code == 200
        assert client.get("/api/runs?token=wrong").status_code == 401
        for path in ("/ws/live", "/ws/ingest"):
            with pytest.raises(WebSocketDenialResponse) as e, client.websocket_connect(path):
                pass
            assert e.value.status_code == 401
        with client.websocket_connect("/ws/live?token=s3cret") as ws:
            assert ws.receive_json()["type"] == "runs"
        # The dashboard opened as /?token=: a cookie instead, and the URL without it.
        r = client.get("/?token=s3cret&run=abc", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/?run=abc"
        cookie = r.headers["set-cookie"]
        assert cookie.startswith("gradwatch-token-default=s3cret;")
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
        jar = {"cookie": "gradwatch-token-default=s3cret"}
        assert client.get("/", headers=jar).status_code == 200
        with client.websocket_connect("/ws/live", headers=jar) as ws:
            assert ws.receive_json()["type"] == "runs"
        assert client.get("/api/runs", headers={"cookie": "gradwatch-token-default=no"}
                          ).status_code == 401
        # A page elsewhere on this machine gets the cookie too (cookies ignore ports), but
        # its writes carry its Origin.
        r = client.delete("/api/runs/x", headers={**jar, "origin": "http://localhost:3000"})
        assert r.status_code == 403
