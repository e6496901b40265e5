"""/v1/messages through the real anthropic client with the default model: greedy text equals
/v1/chat/completions', streaming reassembles into the same message, tools, count_tokens, and
Anthropic-shaped 400s naming the field."""
from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import openai
import pytest

pytestmark = pytest.mark.model
MODEL = "SmolLM2-135M-Instruct"
# the anthropic client has no sampling arguments any more; Ferry still reads temperature
GREEDY = {"temperature": 0}
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                        "b": {"type": "integer", "minimum": 0, "maximum": 99}},
       "required": ["a", "b"], "additionalProperties": False}


@pytest.fixture(scope="module")
def server(make_server: Any) -> Any:
    return make_server(max_running=4)


@pytest.fixture(scope="module")
def client(server: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)


def chat_text(server: Any, messages: list[dict[str, Any]], max_tokens: int,
              **extra: Any) -> str:
    oa = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    reply = oa.chat.completions.create(model=MODEL, messages=messages,  # type: ignore[arg-type]
                                       max_tokens=max_tokens, extra_body=GREEDY, **extra)
    return reply.choices[0].message.content or ""


def test_greedy_text_matches_chat_completions(server: Any, client: anthropic.Anthropic) -> None:
    system, question = "You answer briefly.", "Name three colours."
    msg = client.messages.create(model=MODEL, max_tokens=24, extra_body=GREEDY, system=system,
                                 messages=[{"role": "user", "content": question}])
    expected = chat_text(server, [{"role": "system", "content": system},
                                  {"role": "user", "content": question}], 24)
    assert msg.type == "message" and msg.role == "assistant"
    assert [b.type for b in msg.content] == ["text"]
    assert msg.content[0].text == expected  # type: ignore[union-attr]
    assert msg.stop_reason in ("end_turn", "max_tokens")
    assert msg.usage.input_tokens > 0 and 0 < msg.usage.output_tokens <= 24
    info = httpx.get(f"{server.url}/v1/requests/{msg.id.removeprefix('msg_')}").json()
    assert info["endpoint"] == "/v1/messages"


def test_streaming_events_build_the_same_message(client: anthropic.Anthropic) -> None:
    kwargs: Any = {"model": MODEL, "max_tokens": 20, "extra_body": GREEDY,
                   "messages": [{"role": "user", "content": "Tell me about the sea."}]}
    whole = client.messages.create(**kwargs)
    kinds = []
    with client.messages.stream(**kwargs) as s:
        for ev in s:
            kinds.append(ev.type)
        final = s.get_final_message()
    assert final.content[0].text == whole.content[0].text  # type: ignore[union-attr]
    assert final.stop_reason == whole.stop_reason
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "content_block_stop" in kinds
    assert kinds[-2] == "message_delta"


def test_stop_sequence_is_reported(server: Any, client: anthropic.Anthropic) -> None:
    messages: Any = [{"role": "user", "content": "Count from one to ten in words."}]
    free = client.messages.create(model=MODEL, max_tokens=40, extra_body=GREEDY, messages=messages)
    text = free.content[0].text  # type: ignore[union-attr]
    words = text.split()
    assert len(words) > 2
    stop = words[2]
    cut = client.messages.create(model=MODEL, max_tokens=40, extra_body=GREEDY, messages=messages,
                                 stop_sequences=[stop])
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert text.startswith(cut.content[0].text)  # type: ignore[union-attr]


def test_forced_tool_use_then_result(client: anthropic.Anthropic) -> None:
    tools: Any = [{"name": "add", "description": "Add two numbers", "input_schema": ADD}]
    messages: Any = [{"role": "user", "content": "What is 2 plus 3?"}]
    msg = client.messages.create(model=MODEL, max_tokens=60, extra_body=GREEDY, tools=tools,
                                 tool_choice={"type": "tool", "name": "add"},
                                 messages=messages)
    uses: list[Any] = [b for b in msg.content if b.type == "tool_use"]
    assert msg.stop_reason == "tool_use" and len(uses) >= 1
    assert uses[0].name == "add" and set(uses[0].input) == {"a", "b"}
    # streamed, the same call
    with client.messages.stream(model=MODEL, max_tokens=60, extra_body=GREEDY, tools=tools,
                                tool_choice={"type": "tool", "name": "add"},
                                messages=messages) as s:
        streamed = s.get_final_message()
    streamed_uses: list[Any] = [b for b in streamed.content if b.type == "tool_use"]
    assert streamed_uses[0].input == uses[0].input
    # the loop: the tool's result goes back, the model answers in text
    a, b = uses[0].input["a"], uses[0].input["b"]
    loop: Any = [*messages, {"role": "assistant", "content": msg.content},
                 {"role": "user", "content": [{"type": "tool_result",
                                               "tool_use_id": uses[0].id,
                                               "content": str(a + b)}]}]
    answer = client.messages.create(
        model=MODEL, max_tokens=30, extra_body=GREEDY, tools=tools, tool_choice={"type": "none"},
        messages=loop)
    assert answer.stop_reason in ("end_turn", "max_tokens")
    assert [blk.type for blk in answer.content] == ["text"]


def test_count_tokens_matches_usage(client: anthropic.Anthropic) -> None:
    kwargs: Any = {"model": MODEL, "system": "Be brief.",
                   "messages": [{"role": "user", "content": "Hello there"}]}
    counted = client.messages.count_tokens(**kwargs)
    msg = client.messages.create(max_tokens=2, **kwargs)
    assert counted.input_tokens == msg.usage.input_tokens > 0


def test_errors_are_anthropic_shaped(server: Any, client: anthropic.Anthropic) -> None:
    image: Any = [{"role": "user", "content": [{"type": "image", "source": {}}]}]
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model=MODEL, max_tokens=5, messages=image)
    body: Any = err.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith("messages.0.content.0.type")
    r = httpx.post(f"{server.url}/v1/messages", json={
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("max_tokens")
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="no-such-model", max_tokens=5,
                               messages=[{"role": "user", "content": "hi"}])
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    r = httpx.post(f"{server.url}/v1/messages", content=b"{not json")
    assert r.status_code == 400 and r.json()["type"] == "error"
    r = httpx.post(f"{server.url}/v1/messages", json={
        "model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}],
        "tool_choice": {"type": "sometimes"}})
    assert r.status_code == 400 and "tool_choice.type" in r.json()["error"]["message"]


def test_thinking_flag_reaches_the_template(client: anthropic.Anthropic) -> None:
    # the default model does not think: no thinking block either way, and the flag is accepted
    msg = client.messages.create(model=MODEL, max_tokens=8, extra_body=GREEDY,
                                 thinking={"type": "disabled"},
                                 messages=[{"role": "user", "content": "Hi"}])
    assert all(b.type != "thinking" for b in msg.content)
    assert json.loads(msg.model_dump_json())["content"]


def test_output_config_format_constrains_the_text(client: anthropic.Anthropic) -> None:
    schema = {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 12}},
              "required": ["colour"], "additionalProperties": False}
    msg = client.messages.create(model=MODEL, max_tokens=40, extra_body=GREEDY,
                                 output_config={"format": {"type": "json_schema",
                                                           "schema": schema}},
                                 messages=[{"role": "user", "content": "Pick a colour."}])
    text = msg.content[0].text  # type: ignore[union-attr]
    assert set(json.loads(text)) == {"colour"}
    yaml: Any = {"format": {"type": "yaml"}}
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model=MODEL, max_tokens=5, output_config=yaml,
                               messages=[{"role": "user", "content": "hi"}])
    assert "output_config.format" in err.value.body["error"]["message"]  # type: ignore[index]
