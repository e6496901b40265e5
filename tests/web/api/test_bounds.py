"""Every bound is answered at once, even while the engine is busy: the global queue bound and
the per-user cap (429 + Retry-After, counted as rejections on the dashboard and in /metrics),
and each input limit (400/413 naming the limit). Shared mode picks fair admission and the
interleave policy by default.
"""
from __future__ import annotations

import contextlib
import re
import time
from typing import Any

import httpx
import pytest

from app.settings import Settings, engine_config

pytestmark = pytest.mark.model
MODEL = "SmolLM2-135M-Instruct"
KV_TOKENS = 1024
CONTEXT = 2048
QUICK = 1.0  # seconds: a refusal never waits for the engine


@pytest.fixture(scope="module")
def server(make_server: Any) -> Any:
    return make_server(max_running=2, max_waiting=2, kv_tokens=KV_TOKENS, max_context=CONTEXT,
                       page_size=16,
                       web={"max_tokens_limit": 64, "default_max_tokens": 16, "max_stop": 2,
                            "max_messages": 4, "max_body_bytes": 16 * 1024})


def chat(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


def timed(method: str, url: str, **kw: Any) -> tuple[httpx.Response, float]:
    start = time.perf_counter()
    response = httpx.request(method, url, timeout=30, **kw)
    return response, time.perf_counter() - start


@contextlib.contextmanager
def busy(server: Any, count: int) -> Any:
    """`count` long streaming requests held open (closing them cancels them)."""
    body = {"model": MODEL, "messages": chat("Tell me a long story."), "max_tokens": 64,
            "ignore_eos": True, "stream": True}
    with contextlib.ExitStack() as stack:
        client = stack.enter_context(httpx.Client(base_url=server.url, timeout=60))
        for _ in range(count):
            response = stack.enter_context(client.stream("POST", "/v1/chat/completions",
                                                         json=body))
            assert response.status_code == 200
        yield
    deadline = time.monotonic() + 15
    while server.engine.live_ids():  # closing a stream cancels its request
        assert time.monotonic() < deadline, "held streams were not cancelled"
        time.sleep(0.05)


def test_global_queue_bound_is_a_quick_429_and_counted(server: Any, waiter: Any,
                                                       idle_check: Any) -> None:
    engine = server.engine
    before = engine.snapshot().metrics.rejected
    with busy(server, 4):  # 2 running + 2 waiting: the bound
        waiter(lambda: len(engine.live_ids()) == 4, 10, message="four live")
        body = {"model": MODEL, "messages": chat("one more"), "max_tokens": 4}
        refused, took = timed("POST", server.url + "/v1/chat/completions", json=body)
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
        assert refused.json()["error"]["code"] == "queue_full" and took < QUICK
        assert "queue is full" in refused.json()["error"]["message"]
        streamed, took = timed("POST", server.url + "/v1/completions",
                               json={"model": MODEL, "prompt": "x", "stream": True})
        assert streamed.status_code == 429 and streamed.headers["retry-after"] and took < QUICK
        page, took = timed("POST", server.url + "/c", data={"content": "queue full?"})
        assert page.status_code == 429 and page.headers["retry-after"] and took < QUICK
        assert "queue is full" in page.text
        rejected = waiter(lambda: (n := engine.snapshot().metrics.rejected) >= before + 3
                          and n, 10, message="rejections in a snapshot")
        board = httpx.get(server.url + "/dashboard").text
        assert re.search(rf"<dt>Rejected</dt><dd>{rejected}</dd>", board), "dashboard count"
        metrics = httpx.get(server.url + "/metrics").text
        assert re.search(rf"ferry:requests_rejected_total\{{[^}}]*\}} {rejected}\.0", metrics)
    idle_check(engine)


def words(n: int) -> str:
    return " ".join(["word"] * n)


@pytest.mark.parametrize(("name", "body", "status", "param", "names"), [
    ("context", {"messages": chat(words(CONTEXT + 50))}, 400, "messages",
     f"context of {CONTEXT} tokens"),
    ("KV pool", {"messages": chat(words(1000)), "max_tokens": 64}, 400, "messages",
     f"KV pool of {KV_TOKENS} positions"),
    ("max_tokens", {"messages": chat("hi"), "max_tokens": 65}, 400, "max_tokens",
     "limit of 64"),
    ("stop list", {"messages": chat("hi"), "stop": ["a", "b", "c"]}, 400, "stop", "at most 2"),
    ("messages", {"messages": chat("hi") * 5}, 400, "messages", "at most 4"),
    ("body size", {"messages": chat("x" * 20_000)}, 413, None, "limit of 16384 bytes"),
])
def test_input_limits_are_quick_and_named(server: Any, name: str, body: dict[str, Any],
                                          status: int, param: str | None, names: str) -> None:
    with busy(server, 2):  # the engine is busy generating: refusals still come at once
        response, took = timed("POST", server.url + "/v1/chat/completions",
                               json={"model": MODEL, **body})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert names in error["message"], (name, error["message"])
    assert took < QUICK, f"{name} refused after {took:.2f} s"


def test_a_prompt_that_fits_the_pool_gets_the_room_left(server: Any, idle_check: Any) -> None:
    # without max_tokens the reply gets whatever room the pool leaves: accepted, not refused
    body = {"model": MODEL, "messages": chat(words(900)), "temperature": 0}
    response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    assert usage["total_tokens"] <= KV_TOKENS - 16 + 1
    idle_check(server.engine)


def test_shared_mode_defaults_to_fair_interleave() -> None:
    shared = engine_config(Settings(host="0.0.0.0"))
    assert (shared.policy, shared.admission) == ("interleave", "fair")
    local = engine_config(Settings(host="127.0.0.1"))
    assert (local.policy, local.admission) == ("prefill-first", "fifo")
    chosen = engine_config(Settings(host="0.0.0.0", policy="mixed", admission="fifo"))
    assert (chosen.policy, chosen.admission) == ("mixed", "fifo")
