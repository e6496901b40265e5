"""Upstream mode: a front gets the same Host allow-list as a server with a model (a rebinding
page must not use the upstreams' model through it either)."""
from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import httpx


def test_a_front_refuses_foreign_hosts(make_front: Any, port_picker: Any) -> None:
    front = make_front([f"http://127.0.0.1:{port_picker()}"])  # nothing listens: no model
    port = urlsplit(front.url).port
    chat = {"model": "upstream", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]}
    with httpx.Client(base_url=front.url, timeout=10) as c:
        for host in (f"evil.example:{port}", f"localhost:{port + 1}", f"localhost.:{port}"):
            assert c.get("/", headers={"Host": host}).status_code == 421
            assert c.post("/v1/chat/completions", json=chat,
                          headers={"Host": host}).status_code == 421
            assert c.get("/dashboard/stream", headers={"Host": host}).status_code == 421
        assert c.get("/healthz", headers={"Host": f"localhost:{port}"}).status_code != 421
        page = c.get("/", headers={"Host": f"localhost:{port}"})
        assert page.status_code == 200 and "content-security-policy" in page.headers
