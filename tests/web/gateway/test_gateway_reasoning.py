"""A thinking model through a front in upstream mode: the upstream (a real Ferry server on the
default model under a think-block template, tests/tools/thinking.py) splits the reasoning
out, and the front passes its `reasoning_content` on, in the message and in streamed deltas."""
from __future__ import annotations

import json
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
MESSAGES = [{"role": "system", "content": FEW_SHOT}, {"role": "user", "content": QUESTION}]


@pytest.fixture(scope="module")
def front(make_server: Any, make_front: Any, tokenizer: Any,
          tmp_path_factory: pytest.TempPathFactory) -> Any:
    thinking = with_template(tokenizer, tmp_path_factory.mktemp("thinking"), THINKING_TEMPLATE)
    upstream = make_server(tokenizer_override=thinking, max_running=4)
    return make_front([upstream.url])


def body(front: Any, **fields: Any) -> dict[str, Any]:
    return {"model": front.services.config.model_name, "messages": MESSAGES, "max_tokens": 24,
            "stop": ["\n\nQ:"], "temperature": 0, **fields}


def test_the_message_carries_the_upstreams_reasoning(front: Any) -> None:
    r = httpx.post(front.url + "/v1/chat/completions", json=body(front), timeout=120)
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    assert message["reasoning_content"] == REASONING
    assert message["content"] == ANSWER
    assert "</think>" not in message["content"]
    assert front.gateway.wait_idle(10)


def test_streamed_reasoning_deltas_come_through_in_pieces_before_the_answer(front: Any) -> None:
    deltas: list[dict[str, Any]] = []
    with httpx.stream("POST", front.url + "/v1/chat/completions", timeout=120,
                      json=body(front, stream=True)) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                deltas.extend(c["delta"] for c in chunk["choices"])
    reasoning = [d["reasoning_content"] for d in deltas if d.get("reasoning_content")]
    content = [d["content"] for d in deltas if d.get("content")]
    assert "".join(reasoning) == REASONING and len(reasoning) > 2
    assert "".join(content) == ANSWER
    first_answer = next(i for i, d in enumerate(deltas) if d.get("content"))
    assert all(not d.get("reasoning_content") for d in deltas[first_answer:])
    assert front.gateway.wait_idle(10)
