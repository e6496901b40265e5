"""How each chat template writes tool calls: markers, the call's JSON, and its grammar.

* `hermes`: Hermes / Qwen templates: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
  blocks; the template renders the tool list and the `tool` messages itself.
* `llama3`: Llama 3.1+ templates: the reply is one JSON object `{"name", "parameters"}`
  (optionally after `<|python_tag|>`).
* `mistral`: `[TOOL_CALLS]` then a JSON list of `{"name", "arguments"}`.
* `generic`: templates with no tool support (SmolLM2's): Ferry renders the tool list into the
  system prompt and reads the same `<tool_call>` blocks as hermes; `tool` results go back as
  user messages holding `<tool_response>` blocks, earlier calls as assistant text.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
MAX_PARALLEL = 8  # calls one constrained reply may hold


@dataclass(frozen=True, slots=True)
class ToolFormat:
    name: str
    native: bool  # the template renders tools, tool calls and tool results itself
    args_key: str  # "arguments" or "parameters"
    special: bool  # its markers are special tokens: parse the text with them kept

    def call_schema(self, name: str, parameters: dict[str, Any]) -> dict[str, Any]:
        return {"type": "object",
                "properties": {"name": {"const": name}, self.args_key: parameters},
                "required": ["name", self.args_key], "additionalProperties": False}

    def grammar(self, schemas: list[dict[str, Any]], parallel: bool,
                marker_id: int | None = None) -> str:
        """llguidance Lark text: one call (or up to MAX_PARALLEL) in this format, each
        matching one of `schemas` (the call schemas of the tools allowed)."""
        one = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
        call = "call: %json " + json.dumps(one)
        more = MAX_PARALLEL - 1 if parallel else 0
        if self.name == "llama3":
            return f"start: call\n{call}\n"
        if self.name == "mistral":
            marker = f"<[{marker_id}]>" if marker_id is not None else '"[TOOL_CALLS]"'
            tail = f' (", " call){{0,{more}}}' if more else ""
            return f'start: {marker} "[" call{tail} "]"\n{call}\n'
        block = f'block: "{OPEN}\\n" call "\\n{CLOSE}"\n'
        tail = f' ("\\n" block){{0,{more}}}' if more else ""
        return f"start: block{tail}\n{block}{call}\n"


FORMATS = {
    "generic": ToolFormat("generic", False, "arguments", False),
    "hermes": ToolFormat("hermes", True, "arguments", False),
    "llama3": ToolFormat("llama3", True, "parameters", True),
    "mistral": ToolFormat("mistral", True, "arguments", True),
}


def detect(chat_template: str | None) -> ToolFormat:
    """The format a chat template writes tool calls in (generic when it has none)."""
    t = chat_template or ""
    if "tools" not in t:
        return FORMATS["generic"]
    if OPEN in t:
        return FORMATS["hermes"]
    if "[TOOL_CALLS]" in t:
        return FORMATS["mistral"]
    if "<|python_tag|>" in t or ("ipython" in t and "parameters" in t):
        return FORMATS["llama3"]
    return FORMATS["generic"]


def generic_system(tools: list[dict[str, Any]]) -> str:
    """The generic format's instructions, added to the system prompt."""
    listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return ("You can call functions to answer. They are described, as JSON schemas, in "
            f"<tools></tools>:\n<tools>\n{listed}\n</tools>\n"
            "To call one, reply with only this block (one per call):\n"
            f'{OPEN}\n{{"name": "<function name>", "arguments": {{<arguments as JSON>}}}}\n'
            f"{CLOSE}\nFunction results come back in <tool_response></tool_response> blocks.")


def generic_call_text(name: str, arguments: Any) -> str:
    """An earlier assistant call, written back into the conversation as the model would."""
    return f'{OPEN}\n{json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)}' \
           f"\n{CLOSE}"


def tool_response_text(content: str) -> str:
    return f"<tool_response>\n{content}\n</tool_response>"
