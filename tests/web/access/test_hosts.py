"""The Host allow-list (DNS rebinding) and the security headers, against real servers in local
and shared mode: foreign Host values are refused on a page, an API route, an SSE stream and a
form post before any route runs; the served names work."""
from __future__ import annotations

import socket
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from web.access.hosts import HostError, HostPolicy, check_allowed_host, split_host


def test_split_host() -> None:
    assert split_host("LocalHost:8000") == ("localhost", 8000)
    assert split_host("[::1]:80") == ("[::1]", 80)
    assert split_host("[::1]") == ("[::1]", None)
    assert split_host("example.com") == ("example.com", None)
    for bad in ("", "a:b", "a:0", "a:70000", "::1", "[::1", "[zz]:1", "a/b", "u@h", "a b"):
        assert split_host(bad) is None, bad


def test_policy_rules() -> None:
    policy = HostPolicy.build(False, ["proxy.example", "pinned.example:9000", ".corp.example"])
    bound = ("127.0.0.1", 8000)
    assert policy.allows_host("localhost:8000", "http", bound)
    assert policy.allows_host("[::1]:8000", "http", bound)
    assert not policy.allows_host("localhost:8001", "http", bound)
    assert not policy.allows_host("localhost.:8000", "http", bound)
    assert not policy.allows_host("localhost", "http", bound)  # port 80 is not the bound one
    assert policy.allows_host("proxy.example", "https", bound)  # any port
    assert policy.allows_host("proxy.example:1234", "http", bound)
    assert policy.allows_host("pinned.example:9000", "http", bound)
    assert not policy.allows_host("pinned.example:9001", "http", bound)
    assert policy.allows_host("a.corp.example", "http", bound)
    assert policy.allows_host("corp.example", "http", bound)
    assert not policy.allows_host("evilcorp.example", "http", bound)
    assert not policy.allows_host(None, "http", bound)
    assert policy.allows_origin("http://localhost:8000", bound)
    assert not policy.allows_origin("null", bound)
    assert not policy.allows_origin("http://evil.example:8000", bound)
    # local mode: the machine's names are not served, only loopback and the bound address
    assert not HostPolicy.build(False).allows_host(f"{socket.gethostname()}:8000", "http",
                                                   bound)
    shared = HostPolicy.build(True, machine=["box", "10.0.0.5"])
    assert shared.allows_host("box:8000", "http", ("10.0.0.5", 8000))
    assert shared.allows_host("10.0.0.5:8000", "http", ("0.0.0.0", 8000))
    assert not shared.allows_host("10.0.0.6:8000", "http", ("10.0.0.5", 8000))
    assert policy.describe(8000)[:3] == ["127.0.0.1:8000", "localhost:8000", "[::1]:8000"]
    for bad in ("a/b", "host:port", ""):
        with pytest.raises(HostError):
            check_allowed_host(bad)


def raw_request(url: str, lines: list[str]) -> int:
    """The status of a hand-written HTTP/1.0 request (httpx always sends a Host)."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as conn:
        conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        head = conn.recv(4096).decode("latin-1")
    return int(head.split()[1])


def foreign_hosts(port: int) -> list[str]:
    return [f"evil.example:{port}",  # another name (DNS rebinding)
            f"localhost:{port + 1}",  # the right name, another port
            f"10.11.12.13:{port}",  # an IP other than the bound one
            f"localhost.:{port}", f"127.0.0.1.:{port}",  # trailing dots
            f"localhost:{port}:1", "evil.example"]


def routes(token: str | None) -> list[tuple[str, str, dict[str, Any]]]:
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    chat = {"model": "SmolLM2-135M-Instruct", "max_tokens": 2,
            "messages": [{"role": "user", "content": "hi"}]}
    return [("GET", "/", {"headers": {"Accept": "text/html", **auth}}),
            ("POST", "/v1/chat/completions", {"json": chat, "headers": auth}),
            ("GET", "/dashboard/stream", {"headers": auth}),
            ("POST", "/c", {"data": {"content": "hello"}, "headers": auth}),
            ("GET", "/healthz", {"headers": auth})]


def check_refusals(server: Any, token: str | None) -> None:
    port = urlsplit(server.url).port
    store = server.services.store
    owner = "local" if token is None else "ann"
    before = len(store.conversations(owner))
    with httpx.Client(base_url=server.url, timeout=10) as c:
        for host in foreign_hosts(port):
            for method, path, kwargs in routes(token):
                headers = {**kwargs.pop("headers", {}), "Host": host}
                r = c.request(method, path, headers=headers, **kwargs)
                assert r.status_code == 421, (host, path, r.status_code)
                assert "content-security-policy" in r.headers
        for path in ("/", "/v1/models", "/dashboard/stream"):
            assert raw_request(server.url, [f"GET {path} HTTP/1.0"]) == 400  # no Host at all
    assert len(store.conversations(owner)) == before  # the form posts created nothing
    assert not server.engine.live_ids()  # and the API posts submitted nothing


def check_allowed(server: Any, token: str | None, names: list[str]) -> None:
    port = urlsplit(server.url).port
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(base_url=server.url, timeout=30, headers=auth) as c:
        for name in names:
            host = name if ":" in name.lstrip("[").split("]")[-1] else f"{name}:{port}"
            assert c.get("/healthz", headers={"Host": host}).status_code == 200, host
            page = c.get("/", headers={"Host": host})
            assert page.status_code == 200 and "<html" in page.text, host
            csp = page.headers["content-security-policy"]
            assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
            assert page.headers["x-content-type-options"] == "nosniff"
            assert page.headers["x-frame-options"] == "DENY"
            assert page.headers["referrer-policy"] == "same-origin"
            models = c.get("/v1/models", headers={"Host": host})
            assert models.status_code == 200, host
            with c.stream("GET", "/dashboard/stream", headers={"Host": host}) as stream:
                assert stream.status_code == 200
                assert stream.headers["content-type"].startswith("text/event-stream")
            # a state-changing request from an Origin that is not served: 403
            r = c.post("/c", data={"content": "x"},
                       headers={"Host": host, "Origin": f"http://evil.example:{port}"})
            assert r.status_code == 403, host


@pytest.fixture(scope="module")
def local(make_server: Any, stand_in: Any) -> Any:
    return make_server(executor=stand_in(), web={"allowed_hosts": ("ferry.test",
                                                                   "pinned.test:9")})


@pytest.fixture(scope="module")
def shared(make_shared_server: Any) -> tuple[Any, dict[str, str]]:
    return make_shared_server("hosts", {"ann": True}, web={"allowed_hosts": ("ferry.test",)})


def test_local_refuses_foreign_hosts(local: Any) -> None:
    check_refusals(local, None)


def test_local_serves_its_names(local: Any) -> None:
    check_allowed(local, None, ["127.0.0.1", "localhost", "[::1]", "ferry.test",
                                "ferry.test:443", "pinned.test:9"])
    with httpx.Client(base_url=local.url, timeout=10) as c:
        assert c.get("/", headers={"Host": "pinned.test:10"}).status_code == 421
        created = c.post("/c", data={"content": "hello"}, headers={
            "Origin": local.url, "Sec-Fetch-Site": "same-origin"})
        assert created.status_code == 303  # the form post itself works from the page's origin


def test_shared_refuses_foreign_hosts_even_with_a_token(shared: tuple[Any, dict]) -> None:
    server, tokens = shared
    check_refusals(server, tokens["ann"])


def test_shared_serves_its_names(shared: tuple[Any, dict]) -> None:
    server, tokens = shared
    check_allowed(server, tokens["ann"], ["127.0.0.1", "localhost", "ferry.test"])
    # the machine's own hostname is served in shared mode
    port = urlsplit(server.url).port
    with httpx.Client(base_url=server.url, timeout=10,
                      headers={"Authorization": f"Bearer {tokens['ann']}"}) as c:
        host = socket.gethostname().lower()
        assert c.get("/healthz", headers={"Host": f"{host}:{port}"}).status_code == 200
