"""The other APIs under shared-mode rules (tokens, x-api-key, ownership, Host allow-list),
and a client that goes away mid-stream cancels its request, on each of them."""
from __future__ import annotations

from typing import Any

import anthropic
import httpx
import ollama
import pytest

MODEL = "SmolLM2-135M-Instruct"
HI = [{"role": "user", "content": "hi"}]
# one long streamed request per API (the stand-in never ends a reply by itself)
STREAMS = [
    ("/v1/messages", {"model": MODEL, "max_tokens": 2000, "stream": True, "messages": HI}),
    ("/v1/responses", {"model": MODEL, "max_output_tokens": 2000, "stream": True,
                       "input": "hi"}),
    ("/api/chat", {"model": MODEL, "options": {"num_predict": 2000}, "messages": HI}),
    ("/api/generate", {"model": MODEL, "options": {"num_predict": 2000}, "prompt": "hi"}),
]


@pytest.fixture(scope="module")
def shared(make_shared_server: Any) -> tuple[Any, dict[str, str]]:
    server: tuple[Any, dict[str, str]] = make_shared_server(
        "compat", {"ann": False, "bob": False}, delay=0.02)
    return server


def test_every_route_needs_a_token(shared: tuple[Any, dict[str, str]]) -> None:
    server = shared[0]
    for path, body in STREAMS:
        assert httpx.post(server.url + path, json=body).status_code == 401, path
    assert httpx.get(server.url + "/api/tags").status_code == 401
    assert httpx.post(server.url + "/v1/messages/count_tokens",
                      json={"model": MODEL, "messages": HI}).status_code == 401
    wrong = anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        wrong.messages.create(model=MODEL, max_tokens=2, messages=HI)  # type: ignore[arg-type]


def test_x_api_key_is_a_token_and_requests_stay_their_owners(
        shared: tuple[Any, dict[str, str]]) -> None:
    server, tokens = shared
    client = anthropic.Anthropic(base_url=server.url, api_key=tokens["ann"], max_retries=0)
    msg = client.messages.create(model=MODEL, max_tokens=3, messages=HI)  # type: ignore[arg-type]
    rid = msg.id.removeprefix("msg_")
    own = httpx.get(f"{server.url}/v1/requests/{rid}",
                    headers={"x-api-key": tokens["ann"]}).json()
    assert own["owner"] == "ann" and own["endpoint"] == "/v1/messages"
    other = httpx.get(f"{server.url}/v1/requests/{rid}",
                      headers={"Authorization": f"Bearer {tokens['bob']}"})
    assert other.status_code == 404
    bob = ollama.Client(host=server.url, headers={"Authorization": f"Bearer {tokens['bob']}"})
    assert [m.model for m in bob.list().models] == [f"{MODEL}:latest"]
    reply = bob.chat(model=MODEL, messages=HI, options={"num_predict": 3}, stream=False)
    assert reply.eval_count == 3


def test_foreign_host_is_refused(shared: tuple[Any, dict[str, str]]) -> None:
    server, tokens = shared
    for path, body in STREAMS:
        r = httpx.post(server.url + path, json=body, headers={
            "Host": "evil.example", "Authorization": f"Bearer {tokens['ann']}"})
        assert r.status_code in (400, 421), (path, r.status_code)


@pytest.mark.parametrize(("path", "body"), STREAMS, ids=[p for p, _ in STREAMS])
def test_disconnect_cancels(shared: tuple[Any, dict[str, str]], path: str, body: Any,
                            idle_check: Any, waiter: Any) -> None:
    server, tokens = shared
    headers = {"Authorization": f"Bearer {tokens['ann']}"}
    with httpx.stream("POST", server.url + path, json=body, headers=headers,
                      timeout=30) as r:
        assert r.status_code == 200
        rid = r.headers["x-request-id"]
        lines = r.iter_lines()
        for _ in range(8):  # a few pieces of the reply arrived: it is running
            next(lines)
    info = waiter(lambda: (i := httpx.get(f"{server.url}/v1/requests/{rid}",
                                          headers=headers).json())["state"] == "finished"
                  and i, message="the request ended")
    assert info["finish_reason"] == "cancelled" and info["output_tokens"] < 2000
    assert info["endpoint"] == path
    idle_check(server.engine)


def test_the_board_shows_the_endpoint(shared: tuple[Any, dict[str, str]]) -> None:
    server, tokens = shared
    headers = {"Authorization": f"Bearer {tokens['ann']}"}
    with httpx.stream("POST", server.url + "/api/chat", json=STREAMS[2][1], headers=headers,
                      timeout=30) as r:
        lines = r.iter_lines()  # kept: a dropped iterator closes the connection
        assert '"done": false' in next(lines)  # running now
        board = httpx.get(server.url + "/dashboard", headers={**headers,
                                                              "Accept": "text/html"}).text
    assert 'class="phase endpoint"' in board and "/api/chat" in board
