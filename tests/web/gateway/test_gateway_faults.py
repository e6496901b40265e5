"""Upstreams that misbehave, played by a small real HTTP server in this process: garbage in
the stream, a page that is not a stream, a stream that stalls, a 500. Each is a clear error
within seconds, never a hang; the upstream's API key is sent to it and never shown."""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import httpx
import pytest

KEY = "sk-never-shown-0123"


class BadUpstream(BaseHTTPRequestHandler):
    mode = "garbage"
    seen_auth: ClassVar[list[str]] = []

    def log_message(self, *args: Any) -> None:
        pass

    def _json(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._json(200, {"data": [{"id": "bad-model", "max_model_len": 1024}]})
        else:
            self._json(404, {"detail": "not here"})

    def do_POST(self) -> None:
        BadUpstream.seen_auth.append(self.headers.get("authorization", ""))
        self.rfile.read(int(self.headers.get("content-length") or 0))
        mode = BadUpstream.mode
        if mode == "500":
            self._json(500, {"error": {"message": "the GPU caught fire"}})
            return
        self.send_response(200)
        self.send_header("content-type", "text/html" if mode == "html" else
                         "text/event-stream")
        self.end_headers()
        if mode == "html":
            self.wfile.write(b"<html>hello</html>")
            return
        first = {"choices": [{"index": 0, "text": "Hel", "finish_reason": None}]}
        self.wfile.write(f"data: {json.dumps(first)}\n\n".encode())
        self.wfile.flush()
        if mode == "garbage":
            self.wfile.write(b"data: <html>oops</html>\n\n")
        elif mode == "stall":
            time.sleep(6)  # longer than the front's stall timeout


@pytest.fixture(scope="module")
def bad_upstream() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), BadUpstream)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def front(bad_upstream: str, make_front: Any) -> Any:
    from web.gateway import Gateway, GatewayConfig, UpstreamConfig
    f = make_front([bad_upstream], stall_timeout=1.0)
    # the same front, with the key: rebuild the gateway's config before it serves
    assert isinstance(f.gateway, Gateway)
    config = GatewayConfig((UpstreamConfig(bad_upstream, api_key=KEY),), stall_timeout=1.0)
    f.gateway.gateway_config = config
    for up in f.gateway.upstreams:
        up.config = config.upstreams[0]
    return f


def post(front: Any, stream: bool = False) -> httpx.Response:
    return httpx.post(front.url + "/v1/completions", timeout=20, json={
        "model": "bad-model", "prompt": "hi", "max_tokens": 5, "stream": stream})


def test_garbage_in_the_stream_is_a_clear_error(front: Any) -> None:
    BadUpstream.mode = "garbage"
    started = time.monotonic()
    r = post(front)
    assert r.status_code == 500
    assert "not an OpenAI stream" in r.json()["error"]["message"]
    assert "'<html>oops</html>'" in r.json()["error"]["message"]
    assert time.monotonic() - started < 5
    assert BadUpstream.seen_auth[-1] == f"Bearer {KEY}"


def test_a_stalled_stream_ends_with_the_partial_text_and_the_reason(front: Any) -> None:
    BadUpstream.mode = "stall"
    started = time.monotonic()
    r = post(front, stream=True)
    lines = [line for line in r.text.splitlines() if line.startswith("data: ")]
    assert '"text":"Hel"' in lines[1] or '"text":"Hel"' in lines[0]
    error = next(json.loads(line[6:]) for line in lines if '"error"' in line)
    assert "stopped sending (timed out)" in error["error"]["message"]
    assert front.gateway.upstreams[0].health == "down"
    assert "the reply is incomplete (1 tokens arrived)" in error["error"]["message"]
    assert lines[-1] == "data: [DONE]"
    assert time.monotonic() - started < 5


def wait_up(front: Any) -> None:
    deadline = time.monotonic() + 10
    while front.gateway.upstreams[0].health != "up":
        assert time.monotonic() < deadline, "the upstream was not probed up again"
        time.sleep(0.05)


def test_a_page_that_is_not_a_stream_and_a_500(front: Any) -> None:
    wait_up(front)  # a stalled stream marked it down; the next probe finds it answering
    BadUpstream.mode = "html"
    r = post(front)
    assert r.status_code == 500 and "did not answer with an event stream" in r.text
    BadUpstream.mode = "500"
    r = post(front)
    assert r.status_code == 500 and "answered 500: the GPU caught fire" in r.text
    assert front.gateway.wait_idle(5)


def test_the_api_key_never_reaches_a_browser(front: Any) -> None:
    for path in ("/dashboard", "/v1/requests", "/metrics", "/v1/models", "/"):
        body = httpx.get(front.url + path, timeout=10).text
        assert KEY not in body, path
    assert BadUpstream.seen_auth and all(a == f"Bearer {KEY}" for a in BadUpstream.seen_auth)
