"""Reading tool calls in each template's format, whole and streamed in every split (no model)."""
from __future__ import annotations

import json

import pytest

from web.api.structured.formats import FORMATS, detect
from web.api.structured.parse import (
    ArgsPiece,
    CallStart,
    ParsedCall,
    ToolStream,
    assemble,
    loads_lenient,
    parse_reply,
)

NAMES = frozenset({"get_weather", "add"})
CALL = '{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}'
WANT = ParsedCall("get_weather", json.dumps({"city": "Oslo", "days": 2}))


@pytest.mark.parametrize(("fmt", "text", "content", "calls"), [
    ("generic", f"<tool_call>\n{CALL}\n</tool_call>", "", [WANT]),
    ("hermes", f"Let me look.<tool_call>{CALL}</tool_call>", "Let me look.", [WANT]),
    ("generic", f"<tool_call>{CALL}</tool_call>\n<tool_call>{CALL}</tool_call>", "\n",
     [WANT, WANT]),
    ("generic", f"<tool_call>{CALL}", "", [WANT]),  # no closing tag at the end
    ("generic", '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}',
     "", [WANT]),  # closers missing: repaired
    ("generic", '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
     '<tool_call>{"name": "nope", "arguments": {}}</tool_call>', []),  # unknown: content
    ("generic", "<tool_call>{broken</tool_call>", "<tool_call>{broken</tool_call>", []),
    ("generic", "just text <tool", "just text <tool", []),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Oslo", "days": 2}}', "",
     [WANT]),
    ("llama3", '<|python_tag|>{"name": "add", "parameters": {"a": 1}}', "",
     [ParsedCall("add", '{"a": 1}')]),
    ("llama3", "The weather is fine.", "The weather is fine.", []),
    ("mistral", f"[TOOL_CALLS][{CALL}, {CALL}]", "", [WANT, WANT]),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo", "days": 2}', "", [WANT]),
    ("mistral", "Sure, here.", "Sure, here.", []),
])
def test_whole_and_streamed_replies(fmt: str, text: str, content: str,
                                    calls: list[ParsedCall]) -> None:
    assert parse_reply(text, FORMATS[fmt], NAMES) == (content, calls)
    for size in (1, 2, 5, 13):  # every split gives the same pieces, joined
        stream = ToolStream(FORMATS[fmt], NAMES)
        pieces = []
        for i in range(0, len(text), size):
            pieces.extend(stream.push(text[i:i + size]))
        pieces.extend(stream.flush())
        assert assemble(pieces) == (content, calls)


def test_content_before_a_call_streams_before_it_ends() -> None:
    stream = ToolStream(FORMATS["generic"], NAMES)
    assert stream.push("Checking the weather ") == ["Checking the weather "]
    assert stream.push("<tool_") == []  # may be the opening tag: held
    assert stream.push("call>{") == []


def test_lenient_json() -> None:
    assert loads_lenient('{"a": 1} trailing') == {"a": 1}
    assert loads_lenient('{"a": [1, 2') == {"a": [1, 2]}
    assert loads_lenient('{"a": "unterminated') is None
    assert loads_lenient("") is None


def test_formats_detected_from_templates() -> None:
    assert detect(None).name == "generic"
    assert detect("{% for m in messages %}{{ m.content }}{% endfor %}").name == "generic"
    assert detect("{% if tools %}<tool_call>{{ tools }}{% endif %}").name == "hermes"
    assert detect("{% if tools %}[TOOL_CALLS]{% endif %}").name == "mistral"
    assert detect("{% if tools %}<|python_tag|>{% endif %}").name == "llama3"


def test_call_grammars_name_the_format() -> None:
    schema = FORMATS["generic"].call_schema("add", {"type": "object"})
    assert schema["properties"]["name"] == {"const": "add"}
    assert "<tool_call>" in FORMATS["generic"].grammar([schema], parallel=True)
    assert "{0,7}" in FORMATS["generic"].grammar([schema], parallel=True)
    assert "{0," not in FORMATS["hermes"].grammar([schema], parallel=False)
    assert FORMATS["mistral"].grammar([schema], False, 9).startswith("start: <[9]>")
    assert FORMATS["llama3"].call_schema("add", {})["required"] == ["name", "parameters"]


def test_native_templates_get_openai_calls_as_hf_messages() -> None:
    from web.api.structured.tools import ToolPlan, template_input

    tools = ({"type": "function", "function": {"name": "add", "parameters": {}}},)
    plan = ToolPlan(tools, "auto", True, FORMATS["hermes"])
    messages = [{"role": "user", "content": "1+2"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "call_9", "type": "function",
                     "function": {"name": "add", "arguments": '{"a": 1}'}}]},
                {"role": "tool", "tool_call_id": "call_9", "content": "3"}]
    out, template_tools = template_input(plan, messages)
    assert template_tools == list(tools)
    assert out[1] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_9", "type": "function", "function": {"name": "add",
                                                          "arguments": {"a": 1}}}]}
    assert out[2] == {"role": "tool", "tool_call_id": "call_9", "content": "3"}


def test_arguments_stream_as_the_model_writes_them() -> None:
    stream = ToolStream(FORMATS["generic"], NAMES)
    assert stream.push('<tool_call>\n{"name": "get_wea') == []  # the name is not whole yet
    assert stream.push('ther", "arguments": {"ci') == [CallStart("get_weather"),
                                                        ArgsPiece("{")]
    assert stream.push('ty": "Os') == [ArgsPiece('"city": "Os')]  # a string value: as it comes
    assert stream.push('lo", "days": 2') == [ArgsPiece('lo"')]  # 2 may go on: 23
    assert stream.push("}}\n</tool_call>") == [ArgsPiece(', "days": 2}')]
    assert stream.flush() == []


@pytest.mark.parametrize("text", [
    '<tool_call>{"name": "add", "arguments": {"a": 1, "b": [2, {"c": "x\\u00e9y"}], "d": tr',
    '<tool_call>{"name": "add", "arguments": {"a": 1,, "b": 2}}</tool_call>',
    '<tool_call>{"name": "add", "arguments": {"a": "cut in a str',
    '<tool_call>{"name": "add", "arguments": {"a": "esc \\',
    '<tool_call>{"name": "add", "arguments": {"a": -1.5e',
])
def test_a_call_cut_or_broken_midway_still_has_valid_arguments(text: str) -> None:
    """Once a call has started streaming it is a call: its arguments end where the JSON
    stopped being valid, closed, in every split alike."""
    _, (call,) = parse_reply(text, FORMATS["generic"], NAMES)
    assert isinstance(json.loads(call.arguments), dict)
    for size in (1, 3, 7):
        stream = ToolStream(FORMATS["generic"], NAMES)
        pieces = [p for i in range(0, len(text), size) for p in stream.push(text[i:i + size])]
        assert assemble(pieces + stream.flush())[1] == [call]


def test_a_name_after_the_arguments_is_read_whole() -> None:
    text = '<tool_call>{"arguments": {"a": 1}, "name": "add"}</tool_call>'
    stream = ToolStream(FORMATS["generic"], NAMES)
    cut = text.index('"name"')
    assert stream.push(text[:cut]) == []  # no name yet when the arguments came: held
    assert stream.push(text[cut:]) == [CallStart("add"), ArgsPiece('{"a": 1}')]
