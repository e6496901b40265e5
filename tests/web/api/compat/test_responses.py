"""/v1/responses through the real openai client with the default model: greedy text equals
/v1/chat/completions', the stream's event sequence builds the same response, a function-call
loop, structured output through text.format, and OpenAI-shaped 400s naming the field."""
from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import openai
import pytest

pytestmark = pytest.mark.model
MODEL = "SmolLM2-135M-Instruct"
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                        "b": {"type": "integer", "minimum": 0, "maximum": 99}},
       "required": ["a", "b"], "additionalProperties": False}
TOOLS: Any = [{"type": "function", "name": "add", "description": "Add two numbers",
               "parameters": ADD}]


@pytest.fixture(scope="module")
def server(make_server: Any) -> Any:
    return make_server(max_running=4)


@pytest.fixture(scope="module")
def client(server: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def test_greedy_text_matches_chat_completions(server: Any, client: openai.OpenAI) -> None:
    r = client.responses.create(model=MODEL, instructions="You answer briefly.",
                                input="Name three colours.", max_output_tokens=24,
                                temperature=0)
    chat = client.chat.completions.create(
        model=MODEL, max_tokens=24, temperature=0,
        messages=[{"role": "system", "content": "You answer briefly."},
                  {"role": "user", "content": "Name three colours."}])
    assert r.object == "response" and r.status in ("completed", "incomplete")
    assert r.output_text == chat.choices[0].message.content
    assert r.usage is not None and r.usage.input_tokens == chat.usage.prompt_tokens  # type: ignore[union-attr]
    info = httpx.get(f"{server.url}/v1/requests/{r.id.removeprefix('resp_')}").json()
    assert info["endpoint"] == "/v1/responses"


def test_items_input_and_stream_events(client: openai.OpenAI) -> None:
    kwargs: Any = {"model": MODEL, "max_output_tokens": 16, "temperature": 0, "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Hello, who are you?"}]}]}
    whole = client.responses.create(**kwargs)
    kinds, text, completed = [], "", None
    for ev in client.responses.create(stream=True, **kwargs):
        kinds.append(ev.type)
        if ev.type == "response.output_text.delta":
            text += ev.delta
        if ev.type in ("response.completed", "response.incomplete"):
            completed = ev.response
    assert kinds[:5] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added",
                         "response.output_text.delta"]
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done",
                            "response.output_item.done"]
    assert text == whole.output_text and completed is not None
    assert completed.output_text == whole.output_text and completed.status == whole.status


def test_function_call_loop(client: openai.OpenAI) -> None:
    items: Any = [{"role": "user", "content": "What is 2 plus 3? Use the tool."}]
    first = client.responses.create(model=MODEL, input=items, tools=TOOLS, tool_choice="required",
                                    max_output_tokens=60, temperature=0)
    calls = [o for o in first.output if o.type == "function_call"]
    assert calls and calls[0].name == "add"
    args = json.loads(calls[0].arguments)
    jsonschema.validate(args, ADD)
    streamed: list[Any] = [ev.item for ev in client.responses.create(
        model=MODEL, input=items, tools=TOOLS, tool_choice="required", max_output_tokens=60,
        temperature=0, stream=True) if ev.type == "response.output_item.done"]
    assert json.loads(streamed[0].arguments) == args
    items += [calls[0].model_dump(exclude_none=True),
              {"type": "function_call_output", "call_id": calls[0].call_id,
               "output": str(args["a"] + args["b"])}]
    second = client.responses.create(model=MODEL, input=items, tools=TOOLS, tool_choice="none",
                                     max_output_tokens=30, temperature=0)
    assert [o.type for o in second.output] == ["message"] and second.output_text


def test_structured_output_through_text_format(client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 12}},
              "required": ["colour"], "additionalProperties": False}
    r = client.responses.create(model=MODEL, input="Pick a colour.", max_output_tokens=40,
                                temperature=0, text={"format": {"type": "json_schema",
                                                                "name": "pick",
                                                                "schema": schema}})
    jsonschema.validate(json.loads(r.output_text), schema)


def test_errors_name_the_field(server: Any, client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=MODEL, input="hi", previous_response_id="resp_x")
    assert err.value.body["param"] == "previous_response_id"  # type: ignore[index]
    image: Any = [{"role": "user", "content": [{"type": "input_image",
                                                 "image_url": "http://x/y.png"}]}]
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=MODEL, input=image)
    assert err.value.body["param"] == "input[0].content[0].type"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=MODEL, input="hi", tools=[{"type": "web_search"}])
    assert err.value.body["param"] == "tools[0].type"  # type: ignore[index]
    r = httpx.post(f"{server.url}/v1/responses", json={"model": MODEL, "input": []})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"
    r = httpx.post(f"{server.url}/v1/responses", json={"model": MODEL, "input": "hi",
                                                       "max_output_tokens": 10**9})
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "max_output_tokens"
    assert error["message"].startswith("max_output_tokens")
