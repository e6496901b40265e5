"""Thinking plus tools: the default model under a template that opens a think block
(tests/tools/thinking.py), with tools (the generic format: the template has none). The
reasoning comes back as reasoning_content and the call as tool_calls, whole and streamed;
a forced call (tool_choice required) still lets the model think first."""
from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import pytest

from tests.tools.thinking import THINKING_TEMPLATE, with_template

pytestmark = pytest.mark.model
MODEL = "SmolLM2-135M-Instruct"
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
           "required": ["city"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
# greedy decoding follows the pattern: think a line, close the block, call the tool
FEW_SHOT = "\n\n".join(
    f"Q: Weather in {city}?\n<think>\nThe user wants the weather in {city}.\n</think>\n"
    f'<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{city}"}}}}\n</tool_call>'
    for city in ("Paris", "Rome", "Lima"))
MESSAGES = [{"role": "system", "content": FEW_SHOT},
            {"role": "user", "content": "Weather in Oslo?"}]
REASONING = "The user wants the weather in Oslo."
# one call; the stop string ends the reply where the pattern would ask the next question
BODY = {"model": MODEL, "messages": MESSAGES, "tools": TOOLS, "max_tokens": 60,
        "temperature": 0, "parallel_tool_calls": False, "stop": ["\n\nQ:"]}


@pytest.fixture(scope="module")
def server(make_server: Any, tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    thinking = with_template(tokenizer, tmp_path_factory.mktemp("thinking"), THINKING_TEMPLATE)
    return make_server(tokenizer_override=thinking, max_running=4)


def chat(server: Any, **fields: Any) -> dict[str, Any]:
    body = {**BODY, **fields}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return dict(r.json())


def stream(server: Any, **fields: Any) -> list[dict[str, Any]]:
    body = {**BODY, "stream": True, **fields}
    deltas = []
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body,
                      timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                deltas.extend(c for c in json.loads(line[6:])["choices"])
    return deltas


@pytest.mark.parametrize("choice", ["auto", "required"])
def test_the_reasoning_goes_apart_and_the_call_to_tool_calls(server: Any, choice: str,
                                                               idle_check: Any) -> None:
    reply = chat(server, tool_choice=choice)["choices"][0]
    message = reply["message"]
    assert message["reasoning_content"] == REASONING
    (call,) = message["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    args = json.loads(call["function"]["arguments"])
    jsonschema.validate(args, WEATHER)
    assert args == {"city": "Oslo"}
    assert not message.get("content") and reply["finish_reason"] == "tool_calls"
    idle_check(server.engine)


def test_streamed_reasoning_then_the_call(server: Any) -> None:
    whole = chat(server, tool_choice="required")["choices"][0]["message"]
    choices = stream(server, tool_choice="required")
    deltas = [c["delta"] for c in choices]
    reasoning = "".join(d.get("reasoning_content") or "" for d in deltas)
    calls = [tc for d in deltas for tc in d.get("tool_calls") or []]
    assert reasoning == whole["reasoning_content"] == REASONING
    first_call = next(i for i, d in enumerate(deltas) if d.get("tool_calls"))
    assert all(not d.get("reasoning_content") for d in deltas[first_call:])
    assert calls[0]["function"]["name"] == "get_weather" and calls[0]["id"].startswith("call_")
    arguments = "".join(tc["function"].get("arguments") or "" for tc in calls)
    assert arguments == whole["tool_calls"][0]["function"]["arguments"]
    assert choices[-1]["finish_reason"] == "tool_calls"


def test_a_json_schema_lets_the_model_think_first(server: Any) -> None:
    """response_format after a prompt that opened a think block: the reasoning is free, the
    answer after it validates."""
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": WEATHER}}
    body = {**BODY, "response_format": fmt}
    del body["tools"], body["parallel_tool_calls"]
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["message"]["reasoning_content"] == REASONING
    jsonschema.validate(json.loads(choice["message"]["content"]), WEATHER)
    assert choice["finish_reason"] == "stop"
