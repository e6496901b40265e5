"""Remote image URLs against a real second HTTP server: refused while `fetch_image_urls` is
off (the default) and, in shared mode, for normal users; fetched when allowed, with the same
reply as the same image sent inline; a 400 naming why for a missing image, one too large (by
its header or by what arrives), one too slow, and a redirect loop."""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.tools.tiny_llava import ask, build, chat_server, content, png

PICTURE = png(7)
FREE_WHILE_FETCHED: list[int] = []
LIMIT = 32 * 1024  # image_fetch_bytes in these servers: the picture fits, /big does not


class _Images(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/picture.png":
            self._send(200, PICTURE)
        elif self.path == "/big.png":
            self._send(200, PICTURE + bytes(2 * LIMIT))
        elif self.path == "/drip.png":  # no length given: the limit holds on what arrives
            self.send_response(200)
            self.send_header("content-type", "image/png")
            self.end_headers()
            for _ in range(4):
                self.wfile.write(bytes(LIMIT))
        elif self.path == "/probe.png":  # what the decoding places read while it is fetched
            from web.api.vision.images import DECODES

            FREE_WHILE_FETCHED.append(DECODES._value)  # type: ignore[attr-defined]
            self._send(200, PICTURE)
        elif self.path == "/slow.png":
            time.sleep(3)
            self._send(200, PICTURE)
        elif self.path == "/loop.png":
            self.send_response(302)
            self.send_header("location", "/loop.png")
            self.end_headers()
        else:
            self._send(404, b"no such picture")

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", "image/png")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def pictures() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def llava(tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("llava-fetch")
    build(folder, tokenizer)
    return folder


def _remote(url: str) -> list[dict[str, Any]]:
    return [{"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": "What is in the picture?"}]


def _code(r: httpx.Response) -> str:
    assert r.status_code == 400, r.text
    return str(r.json()["error"]["code"])


def test_remote_urls_are_refused_by_default(llava: Path, make_server: Any,
                                            pictures: str) -> None:
    server = chat_server(make_server, llava)
    r = ask(server, _remote(pictures + "/picture.png"))
    assert _code(r) == "image_fetch_disabled" and "fetch_image_urls" in r.json()["error"]["message"]


def test_a_fetched_image_answers_as_the_same_image_inline(llava: Path, make_server: Any,
                                                          pictures: str) -> None:
    server = chat_server(make_server, llava, fetch_image_urls=True, image_fetch_bytes=LIMIT,
                         image_fetch_seconds=1.0)
    fetched = ask(server, _remote(pictures + "/picture.png"))
    inline = ask(server, content("What is in the picture?", [PICTURE]))
    assert fetched.status_code == inline.status_code == 200, fetched.text
    assert fetched.json()["choices"][0]["message"] == inline.json()["choices"][0]["message"]
    assert fetched.json()["usage"]["prompt_tokens"] == inline.json()["usage"]["prompt_tokens"]
    for path, why in (("/missing.png", "answered 404"), ("/big.png", "above the limit"),
                      ("/drip.png", "above the limit"), ("/slow.png", "longer than 1 s"),
                      ("/loop.png", "redirects")):
        r = ask(server, _remote(pictures + path))
        assert _code(r) == "image_fetch_failed" and why in r.json()["error"]["message"], r.text
        assert r.json()["error"]["param"] == "messages[0].content[0].image_url.url"
    # a slow server holds one request's fetch, never a place other users' images decode in
    assert ask(server, _remote(pictures + "/probe.png")).status_code == 200
    assert FREE_WHILE_FETCHED == [4]
    assert server.engine.wait_idle(30)
    snap = server.engine.snapshot()
    assert snap.kv.used == snap.kv.reserved == 0 and all(s is None for s in snap.slots)


def test_shared_mode_fetches_for_admins_only(llava: Path, make_server: Any, pictures: str,
                                             tmp_path: Path) -> None:
    from web.access.users import UserStore

    users = UserStore(tmp_path / "users.json")
    admin, normal = users.add("ada", admin=True), users.add("bob", admin=False)
    server = chat_server(make_server, llava, data_dir=tmp_path, shared=True,
                         fetch_image_urls=True, image_fetch_bytes=LIMIT)
    body = {"model": "", "max_tokens": 3, "temperature": 0,
            "messages": [{"role": "user", "content": _remote(pictures + "/picture.png")}]}
    url = server.url + "/v1/chat/completions"
    r = httpx.post(url, json=body, headers={"authorization": f"Bearer {normal}"}, timeout=60)
    assert _code(r) == "image_fetch_disabled"
    r = httpx.post(url, json=body, headers={"authorization": f"Bearer {admin}"}, timeout=60)
    assert r.status_code == 200, r.text
