"""The OpenAI-compatible API, request inspection/cancel, metrics and health, against the real
server and model, through the official `openai` client and httpx."""
from __future__ import annotations

import asyncio
import json
import re
import threading
from typing import Any

import httpx
import openai
import pytest

pytestmark = pytest.mark.model
MODEL = "SmolLM2-135M-Instruct"
MAX_RUNNING = 8


@pytest.fixture(scope="module")
def server(make_server: Any) -> Any:
    return make_server(max_running=MAX_RUNNING, max_waiting=64,
                       web={"max_stop": 2, "max_messages": 4, "max_tokens_limit": 1000,
                            "max_body_bytes": 64 * 1024, "default_max_tokens": 16})


@pytest.fixture(scope="module")
def client(server: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def chat(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


def test_models_health_and_schema(server: Any, client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]
    assert httpx.get(server.url + "/healthz").json() == {"status": "ok", "engine": True}
    schema = httpx.get(server.url + "/schema/openapi.json").json()
    ok = schema["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]["content"]
    assert {"application/json", "text/event-stream"} <= set(ok)
    assert "text/event-stream" in schema["paths"]["/v1/completions"]["post"]["responses"][
        "200"]["content"]
    assert schema["paths"]["/v1/chat/completions"]["post"]["requestBody"]
    bad = schema["paths"]["/v1/chat/completions"]["post"]["responses"]["400"]["content"]
    assert "ErrorResponse" in json.dumps(bad)


def test_chat_completion_usage_and_stream_match(server: Any, client: openai.OpenAI,
                                                tokenizer: Any) -> None:
    messages = chat("What is the capital of France?")
    prompt_len = len(tokenizer.apply_chat_template(messages))
    done = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24,
                                          temperature=0)
    assert "Paris" in done.choices[0].message.content
    assert done.choices[0].finish_reason == "stop"
    assert done.usage.prompt_tokens == prompt_len
    assert done.usage.total_tokens == prompt_len + done.usage.completion_tokens
    assert done.id.startswith("chatcmpl-req-")

    chunks = list(client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=24, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == done.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    usage = chunks[-1].usage
    assert not chunks[-1].choices and usage.prompt_tokens == prompt_len
    assert usage.completion_tokens == done.usage.completion_tokens


def test_ignore_eos_length_and_seed(client: openai.OpenAI) -> None:
    kw: dict[str, Any] = {"model": MODEL, "messages": chat("Hi"), "max_tokens": 12,
                          "temperature": 1.0, "seed": 1234,
                          "extra_body": {"ignore_eos": True, "top_k": 40}}
    a = client.chat.completions.create(**kw)
    b = client.chat.completions.create(**kw)
    assert a.usage.completion_tokens == 12 and a.choices[0].finish_reason == "length"
    assert a.choices[0].message.content == b.choices[0].message.content


def test_completions_with_stop_strings(client: openai.OpenAI) -> None:
    prompt = "The days of the week are Monday, Tuesday,"
    full = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0)
    text = full.choices[0].text
    assert full.usage.completion_tokens <= 16 and text
    words = text.split()
    assert len(words) >= 2, text
    stop = words[1]
    cut = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0,
                                    stop=[stop, "\n\n\n"])
    assert cut.choices[0].text == text[:text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    streamed = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16,
                                         temperature=0, stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == cut.choices[0].text


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


@pytest.mark.parametrize(("extra", "param"), [
    ({"n": 17}, "n"),  # n and logprobs are supported now (test_openai_shape, test_logprobs)
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
    ({"tool_choice": {"type": "function", "function": {"name": "g"}},
      "tools": [{"type": "function", "function": {"name": "f"}}]}, "tool_choice"),
    ({"max_tokens": "lots"}, "max_tokens"),
    ({"temperature": 7}, "temperature"),
    ({"max_tokens": 1001}, "max_tokens"),
    ({"stop": ["a", "b", "c"]}, "stop"),
    ({"messages": chat("x") * 5}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
])
def test_bad_requests_are_clear_400s(server: Any, extra: dict[str, Any], param: str) -> None:
    body = {"model": MODEL, "messages": chat("Hi"), **extra}
    error = error_of(httpx.post(server.url + "/v1/chat/completions", json=body), 400)
    assert error["param"] == param and error["type"] == "invalid_request_error"


def test_other_refusals(server: Any, client: openai.OpenAI) -> None:
    url = server.url + "/v1/chat/completions"
    assert error_of(httpx.post(url, json={"model": "gpt-9", "messages": chat("x")}),
                    404)["code"] == "model_not_found"
    assert error_of(httpx.post(url, content=b"{nope", headers={"content-type":
                                                               "application/json"}), 400)
    error_of(httpx.post(url, json={"model": MODEL, "messages": chat("x" * 70_000)}), 413)
    long = " ".join(["word"] * 2100)  # more tokens than the 2048-token context
    error = error_of(httpx.post(url, json={"model": MODEL, "messages": chat(long)}), 400)
    assert "context" in error["message"]
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt=["a", "b"], max_tokens=2)
    error_of(httpx.post(server.url + "/v1/completions",  # echo is supported, not this
                        json={"model": MODEL, "prompt": "x", "echo": True, "suffix": "y"}), 400)


def test_request_inspection_and_cancel(server: Any, waiter: Any, idle_check: Any,
                                       long_stream: Any) -> None:
    with long_stream(server.url, MODEL) as (rid, lines):
        info = httpx.get(f"{server.url}/v1/requests/{rid}").json()
        assert info["state"] == "running" and info["slot"] is not None
        assert info["output_tokens"] >= 1 and info["max_tokens"] == 400
        assert info["timings"]["ttft"] is not None and info["kind"] == "api"
        listed = httpx.get(server.url + "/v1/requests").json()["data"]
        assert rid in [r["id"] for r in listed]
        cancelled = httpx.delete(f"{server.url}/v1/requests/{rid}").json()
        assert cancelled == {"id": rid, "cancelled": True, "state": "finished"}  # as GET says
        rest = list(lines)
    finals = [json.loads(line[6:]) for line in rest if line.startswith("data: {")]
    assert finals[-1]["choices"][0]["finish_reason"] == "stop"  # OpenAI has no "cancelled"
    assert finals[-1]["choices"][0]["ferry_finish_reason"] == "cancelled"
    assert rest[-1] == "data: [DONE]" or "data: [DONE]" in rest
    info = waiter(lambda: (i := httpx.get(f"{server.url}/v1/requests/{rid}").json())[
        "state"] == "finished" and i, message="finished state")
    assert info["finish_reason"] == "cancelled" and info["output_tokens"] < 400
    again = httpx.delete(f"{server.url}/v1/requests/{rid}").json()
    assert again["cancelled"] is False
    error_of(httpx.get(server.url + "/v1/requests/req-nope"), 404)
    error_of(httpx.delete(server.url + "/v1/requests/req-nope"), 404)
    idle_check(server.engine)


def test_client_disconnect_cancels(server: Any, waiter: Any, idle_check: Any) -> None:
    before = server.engine.snapshot().metrics.cancelled
    body = {"model": MODEL, "messages": chat("Tell me a story."), "max_tokens": 500,
            "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body,
                      timeout=60) as response:
        rid = response.headers["x-request-id"]
        next(line for line in response.iter_lines() if '"content":"' in line)
    waiter(lambda: rid not in server.engine.live_ids(), 15, message="stream cancel")
    # a non-streaming request whose client gives up is cancelled too
    body["stream"] = False
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/chat/completions", json=body, timeout=1.5)
    # on a busy machine the request may reach the engine after the client has given up:
    # it is cancelled then, so wait for the count, not only for an empty engine
    waiter(lambda: server.engine.snapshot().metrics.cancelled >= before + 2
           and not server.engine.live_ids(), 15, message="non-stream cancel")
    idle_check(server.engine)


def test_twenty_concurrent_streams(server: Any, tokenizer: Any, idle_check: Any) -> None:
    async def one(client: openai.AsyncOpenAI, i: int) -> tuple[str, Any, int]:
        messages = chat(f"Give me fact number {i} about the sea.")
        stream = await client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=8, temperature=0.8, seed=i,
            stream=True, stream_options={"include_usage": True},
            extra_body={"ignore_eos": True})
        text, usage = "", None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            if chunk.usage:
                usage = chunk.usage
        return text, usage, len(tokenizer.apply_chat_template(messages))

    async def run() -> list[tuple[str, Any, int]]:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused",
                                    max_retries=0, timeout=120)
        try:
            return await asyncio.gather(*(one(client, i) for i in range(20)))
        finally:
            await client.close()

    peak: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.05):
            snap = server.engine.snapshot()
            peak.append(len(snap.running) + len(snap.waiting))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        results = asyncio.run(run())
    finally:
        stop.set()
        watcher.join()
    assert max(peak) > MAX_RUNNING  # some of them really waited for a slot
    for text, usage, prompt_len in results:
        assert usage is not None and usage.completion_tokens == 8
        assert usage.prompt_tokens == prompt_len and text
    idle_check(server.engine)


def test_metrics(server: Any) -> None:
    text = httpx.get(server.url + "/metrics").text
    for name in ("ferry:num_requests_running", "ferry:num_requests_waiting",
                 "ferry:kv_cache_usage_perc", "ferry:num_free_slots",
                 "ferry:time_to_first_token_seconds_bucket",
                 "ferry:inter_token_latency_seconds_bucket", "ferry:generation_tokens_total",
                 "ferry:prompt_tokens_total", "ferry:requests_rejected_total"):
        assert name in text, name
    count = next(line for line in text.splitlines()
                 if line.startswith("ferry:time_to_first_token_seconds_count"))
    assert float(count.split()[-1]) > 0
    free = next(line for line in text.splitlines() if line.startswith("ferry:num_free_slots"))
    assert float(free.split()[-1]) == MAX_RUNNING


def metric(text: str, name: str) -> float:
    line = next(line for line in text.splitlines() if line.startswith(name + "{"))
    return float(line.split()[-1])


def test_speculative_field_and_metrics(server: Any) -> None:
    """A reply that repeats its prompt drafts and keeps tokens (visible in /metrics); the
    same request with "speculative": false drafts nothing and writes the same greedy text."""
    text = ("Repeat this sentence exactly: The lighthouse keeper climbed the spiral stairs "
            "every evening and lit the great lamp before he made his tea.")
    body = {"model": MODEL, "messages": chat(text), "max_tokens": 48, "temperature": 0}

    def drafted() -> tuple[float, float]:
        page = httpx.get(server.url + "/metrics").text
        return (metric(page, "ferry:spec_decode_num_draft_tokens_total"),
                metric(page, "ferry:spec_decode_num_accepted_tokens_total"))

    server.engine.wait_idle(30)
    d0, _ = drafted()
    off = httpx.post(server.url + "/v1/chat/completions", json={**body, "speculative": False},
                     timeout=120).json()
    server.engine.wait_idle(30)
    assert drafted()[0] == d0
    on = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120).json()
    server.engine.wait_idle(30)
    d1, a1 = drafted()
    assert on["choices"][0]["message"] == off["choices"][0]["message"]
    assert d1 > d0 and a1 > 0
    page = httpx.get(server.url + "/metrics").text
    assert 0 < metric(page, "ferry:spec_decode_acceptance_rate") <= 1
    assert metric(page, "ferry:decode_tokens_per_step") > 1
    assert re.search(r'ferry:spec_decode_drafter\{[^}]*drafter="ngram"[^}]*\} 1\.0', page)
    bad = httpx.post(server.url + "/v1/chat/completions", json={**body, "speculative": "yes"})
    assert bad.status_code == 400
