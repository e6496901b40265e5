"""A thinking model's reasoning through the other APIs: Anthropic thinking blocks, Responses
reasoning items, Ollama's `thinking`, whole and streamed (the default model under a template
that opens a think block: tests/tools/thinking.py), and the switch to turn it off."""
from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import ollama
import openai
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
STOP = ["\n\nQ:"]


@pytest.fixture(scope="module")
def server(make_server: Any, tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    thinking = with_template(tokenizer, tmp_path_factory.mktemp("thinking"), THINKING_TEMPLATE)
    return make_server(tokenizer_override=thinking)


def test_anthropic_thinking_blocks(server: Any) -> None:
    client = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)
    kwargs: Any = {"model": MODEL, "max_tokens": 24, "system": FEW_SHOT,
                   "stop_sequences": STOP, "extra_body": {"temperature": 0},
                   "messages": [{"role": "user", "content": QUESTION}]}
    msg = client.messages.create(**kwargs)
    assert [b.type for b in msg.content] == ["thinking", "text"]
    assert msg.content[0].thinking == REASONING
    assert msg.content[1].text == ANSWER
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == STOP[0]
    with client.messages.stream(**kwargs) as s:
        blocks: list[Any] = s.get_final_message().content
    assert [b.type for b in blocks] == ["thinking", "text"]
    assert blocks[0].thinking == REASONING
    off = client.messages.create(**kwargs, thinking={"type": "disabled"})
    assert [b.type for b in off.content] == ["text"]
    assert off.content[0].text.startswith("A: 8")


def test_responses_reasoning_items(server: Any) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    kwargs: Any = {"model": MODEL, "instructions": FEW_SHOT, "input": QUESTION,
                   "max_output_tokens": 24, "temperature": 0}  # no stop strings here
    r = client.responses.create(**kwargs)
    assert [o.type for o in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text == REASONING
    events = list(client.responses.create(stream=True, **kwargs))
    reasoning = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert reasoning == REASONING
    done = next(e for e in events if e.type in ("response.completed", "response.incomplete"))
    assert done.response.output_text == r.output_text
    assert r.output_text.startswith(ANSWER)


def test_ollama_thinking(server: Any) -> None:
    client = ollama.Client(host=server.url)
    messages = [{"role": "system", "content": FEW_SHOT}, {"role": "user", "content": QUESTION}]
    options = {"temperature": 0, "num_predict": 24, "stop": STOP}
    reply = client.chat(model=MODEL, messages=messages, options=options, stream=False)
    assert reply.message.thinking == REASONING and reply.message.content == ANSWER
    parts = list(client.chat(model=MODEL, messages=messages, options=options, stream=True))
    assert "".join(p.message.thinking or "" for p in parts) == REASONING
    assert "".join(p.message.content or "" for p in parts) == ANSWER
    off = client.chat(model=MODEL, messages=messages, options=options, think=False,
                      stream=False)
    assert not off.message.thinking and (off.message.content or "").startswith("A: 8")
    show = httpx.post(server.url + "/api/show", json={"model": MODEL}).json()
    assert "thinking" in show["capabilities"] and json.dumps(show)
