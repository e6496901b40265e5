"""Structured output and tool calls through a front in upstream mode: the fields go to the
upstream (a real Ferry server on the default model) as they came, and its tool calls come back
as tool calls, whole and streamed."""
from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest

pytestmark = pytest.mark.model
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                           "rank": {"type": "integer", "minimum": 1,
                                                    "maximum": 9}},
          "required": ["city", "rank"], "additionalProperties": False}
TOOLS: Any = [{"type": "function", "function": {"name": "locate", "parameters": SCHEMA}}]


@pytest.fixture(scope="module")
def front(make_server: Any, make_front: Any) -> Any:
    upstream = make_server(max_running=4)
    return make_front([upstream.url])


@pytest.fixture(scope="module")
def client(front: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=front.url + "/v1", api_key="none", max_retries=0)


def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def test_json_schema_through_the_front(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=model(client), messages=[{"role": "user", "content": "A city, as JSON"}],
        temperature=0, max_tokens=120, response_format={"type": "json_schema", "json_schema": {
            "name": "city", "schema": SCHEMA, "strict": True}})
    jsonschema.validate(json.loads(reply.choices[0].message.content or ""), SCHEMA)


def test_tool_calls_through_the_front(client: openai.OpenAI) -> None:
    args: Any = {"model": model(client), "tools": TOOLS, "tool_choice": "required",
                 "messages": [{"role": "user", "content": "Where is Oslo?"}],
                 "temperature": 0, "max_tokens": 150, "parallel_tool_calls": False}
    reply = client.chat.completions.create(**args)
    (call,) = reply.choices[0].message.tool_calls or []
    assert reply.choices[0].finish_reason == "tool_calls" and call.function.name == "locate"
    jsonschema.validate(json.loads(call.function.arguments), SCHEMA)
    streamed = {"name": "", "arguments": ""}
    for chunk in client.chat.completions.create(**args, stream=True):
        for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            if d.function is not None:
                streamed["name"] += d.function.name or ""
                streamed["arguments"] += d.function.arguments or ""
    assert streamed == {"name": "locate", "arguments": call.function.arguments}
    messages = [*args["messages"], reply.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": "Norway"}]
    final = client.chat.completions.create(model=model(client), messages=messages,
                                           tools=TOOLS, tool_choice="none", max_tokens=30,
                                           temperature=0)
    assert final.choices[0].message.content and not final.choices[0].message.tool_calls
