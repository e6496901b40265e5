"""Thinking models through the real HTTP API: the default model under a template that opens
a think block (tests/tools/thinking.py), greedy, so its reply really holds `</think>`."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.tools.thinking import (
    ANSWER,
    FEW_SHOT,
    QUESTION,
    REASONING,
    THINKING_TEMPLATE,
    with_template,
)

pytestmark = pytest.mark.model
MODEL = "SmolLM2-135M-Instruct"
MESSAGES = [{"role": "system", "content": FEW_SHOT}, {"role": "user", "content": QUESTION}]


@pytest.fixture(scope="module")
def server(make_server: Any, tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    thinking = with_template(tokenizer, tmp_path_factory.mktemp("thinking"), THINKING_TEMPLATE)
    return make_server(tokenizer_override=thinking)


def chat(server: Any, **body: Any) -> dict[str, Any]:
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 24, "stop": ["\n\nQ:"],
            "temperature": 0, **body}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return dict(r.json())


def stream(server: Any, **body: Any) -> list[dict[str, Any]]:
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 24, "stop": ["\n\nQ:"],
            "stream": True, "stream_options": {"include_usage": True}, "temperature": 0,
            **body}
    chunks = []
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body,
                      timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return chunks


def test_reply_carries_reasoning_content_apart(server: Any, idle_check: Any) -> None:
    body = chat(server)
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] == REASONING
    assert message["content"] == ANSWER  # the stop string ended the answer
    assert "<think>" not in message["content"] and "</think>" not in message["content"]
    assert body["choices"][0]["finish_reason"] == "stop"
    idle_check(server.engine)


def test_stream_sends_reasoning_as_its_own_deltas_first(server: Any) -> None:
    chunks = stream(server, logprobs=True, stop=None)  # every token scored: no stop string
    deltas = [c["choices"][0] for c in chunks if c["choices"]]
    reasoning = [d["delta"]["reasoning_content"] for d in deltas
                 if "reasoning_content" in d["delta"]]
    content = [d["delta"]["content"] for d in deltas if d["delta"].get("content")]
    assert "".join(reasoning) == REASONING and len(reasoning) > 2  # streamed, in pieces
    assert "".join(content).startswith(ANSWER + "\n\nQ:")
    assert all(not ("reasoning_content" in d["delta"] and "content" in d["delta"])
               for d in deltas)  # each delta is one or the other
    first_content = next(i for i, d in enumerate(deltas) if d["delta"].get("content"))
    assert all("reasoning_content" not in d["delta"] for d in deltas[first_content:])
    # logprobs cover every generated token, the reasoning's too
    scored = sum(len(d["logprobs"]["content"]) for d in deltas if d.get("logprobs"))
    assert scored == chunks[-1]["usage"]["completion_tokens"]
    assert chat(server)["choices"][0]["message"]["reasoning_content"] == REASONING


def test_enable_thinking_false_reaches_the_template(server: Any) -> None:
    body = chat(server, chat_template_kwargs={"enable_thinking": False})
    message = body["choices"][0]["message"]
    assert "reasoning_content" not in message  # the prompt closed the block: answer only
    assert message["content"].startswith("A: 8")
    bad = httpx.post(server.url + "/v1/chat/completions", timeout=30, json={
        "model": MODEL, "messages": MESSAGES, "chat_template_kwargs": {"tools_mode": 1}})
    assert bad.status_code == 400 and "tools_mode" in bad.text
    bad = httpx.post(server.url + "/v1/chat/completions", timeout=30, json={
        "model": MODEL, "messages": MESSAGES,
        "chat_template_kwargs": {"enable_thinking": "no"}})
    assert bad.status_code == 400 and "enable_thinking" in bad.text


def test_stop_strings_match_the_answer_not_the_reasoning(server: Any) -> None:
    message = chat(server, stop=["plus"], max_tokens=40)["choices"][0]["message"]
    assert message["reasoning_content"] == REASONING  # "plus" in the thoughts: no stop
    assert message["content"].startswith(ANSWER) and "plus" not in message["content"]


def test_reasoning_sent_back_is_not_fed_to_the_model(server: Any) -> None:
    turn = {"role": "assistant", "content": "8"}
    history = [*MESSAGES, turn, {"role": "user", "content": "5+5?"}]
    plain = chat(server, messages=history, max_tokens=1)
    history[2] = {**turn, "reasoning_content": "A long chain of thought " * 20}
    again = chat(server, messages=history, max_tokens=1)
    assert again["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"]


def test_completions_and_models(server: Any) -> None:
    # /v1/completions returns the text as written: no split there
    prompt = FEW_SHOT + f"\n\nQ: {QUESTION}\n<think>\n"
    r = httpx.post(server.url + "/v1/completions", timeout=60, json={
        "model": MODEL, "prompt": prompt, "max_tokens": 12, "temperature": 0})
    assert r.json()["choices"][0]["text"].startswith(REASONING + "\n</think>")
    card = httpx.get(server.url + "/v1/models", timeout=10).json()["data"][0]
    assert card["reasoning"] is True and "<think>" in card["chat_template"]


def test_a_model_without_think_tags_is_untouched(make_server: Any, tokenizer: Any,
                                                 tmp_path: Path) -> None:
    assert not tokenizer.thinks and tokenizer.reasoning_for([1, 2, 3]) is None
    server = make_server()
    body = {"model": MODEL, "max_tokens": 24, "messages": [
        {"role": "user", "content": "Write <think>hello</think> back to me."}]}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).json()
    assert "reasoning_content" not in r["choices"][0]["message"]
    card = httpx.get(server.url + "/v1/models", timeout=10).json()["data"][0]
    assert card["reasoning"] is False and card["chat_template"] == "the model's own"
