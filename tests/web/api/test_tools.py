"""Tool calling through the real openai client with the default model (generic format: SmolLM2's
template has no tools): forced calls validate against the tool's schema, a streamed call
reassembles into the same call, and a whole loop (call -> tool result -> answer) runs."""
from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from web.api.errors import APIError
from web.api.structured.formats import FORMATS
from web.api.structured.tools import ToolPlan, check_system_prompt, template_input

pytestmark = pytest.mark.model
MODEL = "SmolLM2-135M-Instruct"
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 20},
    "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 999},
                                        "b": {"type": "integer", "minimum": 0,
                                              "maximum": 999}},
       "required": ["a", "b"], "additionalProperties": False}
TOOLS: Any = [
    {"type": "function", "function": {"name": "get_weather", "description":
                                      "Current weather in a city", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "add", "description": "Add two numbers",
                                      "parameters": ADD}}]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}


@pytest.fixture(scope="module")
def server(make_server: Any) -> Any:
    return make_server(max_running=8)


@pytest.fixture(scope="module")
def client(server: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def ask(text: str) -> Any:
    return [{"role": "user", "content": text}]


def valid_calls(message: Any) -> list[Any]:
    calls = message.tool_calls or []
    for call in calls:
        assert call.id.startswith("call_") and call.type == "function"
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    return calls


@pytest.mark.parametrize("prompt", ["What is the weather in Oslo?", "Add 3 and 4.",
                                    "Hello there!"])
def test_required_gives_a_valid_call(client: openai.OpenAI, prompt: str) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=ask(prompt), tools=TOOLS,
                                           tool_choice="required", temperature=0,
                                           parallel_tool_calls=False, max_tokens=200)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert len(valid_calls(choice.message)) == 1


def test_named_function_is_the_one_called(client: openai.OpenAI, server: Any) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=ask("What is the weather like in Lima?"), tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "add"}}, max_tokens=200,
        temperature=0.8, seed=3)
    (call,) = valid_calls(reply.choices[0].message)
    assert call.function.name == "add" and reply.choices[0].finish_reason == "tool_calls"
    assert server.engine.wait_idle(30)


def test_a_streamed_call_reassembles_into_the_same_call(client: openai.OpenAI) -> None:
    args: Any = {"model": MODEL, "messages": ask("Weather in Rome, in celsius?"),
                 "tools": TOOLS, "tool_choice": "required", "temperature": 0,
                 "max_tokens": 200}
    whole = client.chat.completions.create(**args).choices[0].message.tool_calls
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in client.chat.completions.create(**args, stream=True):
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for d in choice.delta.tool_calls or []:
                got = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
                got["id"] += d.id or ""
                if d.function is not None:
                    got["name"] += d.function.name or ""
                    got["arguments"] += d.function.arguments or ""
    assert finish == "tool_calls" and whole is not None
    assert [(c["name"], c["arguments"]) for c in calls.values()] == \
        [(c.function.name, c.function.arguments) for c in whole]
    assert all(c["id"].startswith("call_") for c in calls.values())


NOTE: Any = {"type": "function", "function": {"name": "note", "description": "Save a note",
                                             "parameters": {"type": "object", "properties": {
                                                 "text": {"type": "string", "minLength": 40,
                                                          "maxLength": 80}},
                                                 "required": ["text"],
                                                 "additionalProperties": False}}}


def test_long_arguments_stream_in_fragments_as_they_are_written(server: Any) -> None:
    """Each argument fragment goes out with the tokens that wrote it (the chunk carries their
    logprobs), not once the call is complete; joined, they are the whole reply's call."""
    body = {"model": MODEL, "messages": ask("Save a note about the weather in Oslo."),
            "tools": [NOTE], "tool_choice": {"type": "function", "function": {"name": "note"}},
            "temperature": 0, "max_tokens": 120}
    whole = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120).json()
    (call,) = whole["choices"][0]["message"]["tool_calls"]
    fragments: list[tuple[str, bool]] = []  # (arguments piece, its chunk carries logprobs)
    with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=120,
                      json={**body, "stream": True, "logprobs": True}) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:])["choices"]:
                for d in choice["delta"].get("tool_calls") or []:
                    if d.get("function", {}).get("arguments"):
                        fragments.append((d["function"]["arguments"],
                                          bool(choice.get("logprobs"))))
    assert "".join(f for f, _ in fragments) == call["function"]["arguments"]
    assert len(json.loads(call["function"]["arguments"])["text"]) >= 40
    assert sum(1 for _, scored in fragments if scored) >= 5  # sent as the tokens came
    assert server.engine.wait_idle(30)


def test_a_whole_tool_loop(client: openai.OpenAI, server: Any) -> None:
    messages: list[Any] = ask("What is 12 plus 30? Use the add tool.")
    first = client.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, temperature=0, max_tokens=200,
        tool_choice={"type": "function", "function": {"name": "add"}})
    (call,) = valid_calls(first.choices[0].message)
    args = json.loads(call.function.arguments)
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id,
                     "content": json.dumps({"sum": args["a"] + args["b"]})})
    final = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS,
                                           tool_choice="none", temperature=0, max_tokens=60)
    assert final.choices[0].finish_reason in ("stop", "length")
    assert final.choices[0].message.content and not final.choices[0].message.tool_calls
    alone = client.chat.completions.create(model=MODEL, messages=messages[:1], tools=TOOLS,
                                           tool_choice="none", max_tokens=1)
    assert final.usage is not None and alone.usage is not None
    assert final.usage.prompt_tokens > alone.usage.prompt_tokens + 20  # call and result went in
    assert server.engine.wait_idle(30)


def test_auto_never_returns_broken_calls(client: openai.OpenAI) -> None:
    for i, prompt in enumerate(["Weather in Paris?", "Add 1 and 2", "Tell me a joke."]):
        reply = client.chat.completions.create(model=MODEL, messages=ask(prompt), tools=TOOLS,
                                               temperature=0.7, seed=i, max_tokens=120)
        message = reply.choices[0].message
        calls = valid_calls(message) if message.tool_calls else []
        assert calls or isinstance(message.content, str)
        assert (reply.choices[0].finish_reason == "tool_calls") == bool(calls)


def test_the_conversation_goes_through_the_template(tokenizer: Any) -> None:
    plan = ToolPlan(tuple(TOOLS), "auto", True, FORMATS["generic"])
    messages = [{"role": "user", "content": "Add 1 and 2"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": '{"sum": 3}'}]
    rendered, native_tools = template_input(plan, messages)
    assert native_tools is None
    text = tokenizer.render_chat(rendered)
    assert '"name": "add"' in text and "<tools>" in text  # the tool list, in the system part
    assert '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}' in text
    assert '<tool_response>\n{"sum": 3}\n</tool_response>' in text


def test_a_template_without_system_messages_cannot_carry_tools() -> None:
    def drops_system(messages: list[dict[str, str]]) -> str:
        return "".join(m["content"] for m in messages if m["role"] != "system")

    with pytest.raises(APIError) as err:
        check_system_prompt(drops_system)
    assert err.value.param == "tools"
