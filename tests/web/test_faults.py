"""A round that raises, through the real server and model: the one fake allowed is the fault
itself (the model executor wrapped so one chosen round raises).

The requests of that round end with an error: an API stream sends an OpenAI-style error
event and then [DONE], a non-streaming request gets a 500 in OpenAI's error shape, a chat
reply is saved `incomplete` with the error and the page shows it. Then the server goes on:
later requests succeed, /healthz is ok, and every slot and KV page is free.
"""
from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.scheduling.batch import Batch
from engine.scheduling.request import Request

pytestmark = pytest.mark.model
MODEL = "SmolLM2-135M-Instruct"
ENGINE = {"max_running": 4, "kv_tokens": 8192, "max_context": 2048}


class FaultyExecutor:
    """The real executor; once armed, the next round that decodes raises instead."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.armed = threading.Event()
        self.fired = threading.Event()
        self.failed_batch: list[str] = []

    def run(self, batch: Batch) -> list[int | None]:
        if self.armed.is_set() and any(item.is_decode for item in batch.items):
            self.armed.clear()
            self.failed_batch = [item.request.id for item in batch.items]
            self.fired.set()
            raise RuntimeError("injected fault")
        return self.inner.run(batch)

    def release(self, request: Request) -> None:
        self.inner.release(request)


@pytest.fixture(scope="module")
def faulty(weights: Any, model_dir: Path) -> FaultyExecutor:
    from engine.config import EngineConfig
    from engine.execution.executor import ModelExecutor
    from engine.execution.text.tokenizer import read_eos_ids
    inner = ModelExecutor(weights, EngineConfig(**ENGINE), "cpu", None, read_eos_ids(model_dir),
                          model_dir)
    return FaultyExecutor(inner)


@pytest.fixture(scope="module")
def server(make_server: Any, faulty: FaultyExecutor) -> Any:
    return make_server(executor=faulty, **ENGINE,
                       web={"chat_ignore_eos": True, "default_max_tokens": 60,
                            "save_interval": 0.1})


def fire(faulty: FaultyExecutor) -> None:
    faulty.fired.clear()
    faulty.armed.set()
    assert faulty.fired.wait(30), "the fault never fired"


def stream_body(content: str) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}],
            "max_tokens": 300, "ignore_eos": True, "stream": True}


def test_failed_round_ends_streams_with_an_error(server: Any, faulty: FaultyExecutor,
                                                 waiter: Any, idle_check: Any) -> None:
    store = server.services.store
    made = httpx.post(server.url + "/c", data={"content": "Write a long poem about rivers."},
                      follow_redirects=False, timeout=30)
    assert made.status_code == 303
    cid = int(made.headers["location"].rsplit("/", 1)[1])
    reply = store.messages(cid)[-1]
    assert reply.role == "assistant" and reply.status == "streaming"

    with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=60,
                      json=stream_body("Tell me a long story.")) as response:
        rid = response.headers["x-request-id"]
        lines = response.iter_lines()
        next(line for line in lines if '"content":"' in line and '"content":""' not in line)
        waiter(lambda: store.message(reply.id).content, 30, message="a saved partial reply")
        fire(faulty)
        rest = [line for line in lines if line.startswith("data: ")]
    assert rid in faulty.failed_batch and reply.request_id in faulty.failed_batch
    assert rest[-1] == "data: [DONE]"
    error = json.loads(rest[-2][6:])["error"]
    assert error["type"] == "server_error" and "injected fault" in error["message"]

    saved = waiter(lambda: (m := store.message(reply.id)).status != "streaming" and m, 10,
                   message="the chat reply ended")
    assert saved.status == "incomplete" and saved.finish_reason == "error"
    assert "injected fault" in (saved.error or "") and saved.content
    page = httpx.get(f"{server.url}/c/{cid}").text
    assert "incomplete" in page and "injected fault" in page
    # the page's stream of a finished reply gives its final form at once, then `done`
    events = httpx.get(f"{server.url}/c/{cid}/messages/{reply.id}/stream", timeout=10).text
    assert "event: final" in events and "event: done" in events
    idle_check(server.engine)
    assert server.engine.snapshot().metrics.errors >= 2


def test_non_streaming_request_gets_a_500(server: Any, faulty: FaultyExecutor,
                                          waiter: Any, idle_check: Any) -> None:
    body = {**stream_body("Count slowly to a thousand."), "stream": False}
    answer: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: answer.append(
        httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)))
    thread.start()
    waiter(lambda: any(v.output_tokens for v in server.engine.snapshot().running), 30,
           message="decoding")
    fire(faulty)
    thread.join(30)
    assert answer and answer[0].status_code == 500
    error = answer[0].json()["error"]
    assert error["type"] == "server_error" and "injected fault" in error["message"]
    idle_check(server.engine)


def test_server_goes_on_after_faults(server: Any, waiter: Any, idle_check: Any) -> None:
    health = httpx.get(server.url + "/healthz")
    assert health.json() == {"status": "ok", "engine": True}
    done = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8,
        "ignore_eos": True})
    assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] == 8
    with httpx.stream("POST", server.url + "/v1/completions", timeout=60, json={
            "model": MODEL, "prompt": "Once upon a time", "max_tokens": 8, "ignore_eos": True,
            "stream": True}) as response:
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and '"finish_reason":"length"' in "".join(lines)
    made = httpx.post(server.url + "/c", data={"content": "Say hello."}, follow_redirects=False,
                      timeout=30)
    cid = int(made.headers["location"].rsplit("/", 1)[1])
    store = server.services.store
    mid = store.messages(cid)[-1].id
    events = httpx.get(f"{server.url}/c/{cid}/messages/{mid}/stream", timeout=120).text
    assert "event: token" in events and "event: done" in events  # as the page follows it
    reply = store.message(mid)
    assert reply.status == "complete" and reply.content and reply.error is None
    assert reply.finish_reason == "length"
    idle_check(server.engine)
