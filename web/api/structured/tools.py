"""Tool calling on /v1/chat/completions: `tools`, `tool_choice`, `parallel_tool_calls`.

`plan` checks the fields (400s name the field) and picks the model's tool format
(web/api/structured/formats.py); `template_input` turns the conversation (assistant `tool_calls`,
`role: tool` results) into what the chat template takes; `constraint` is the grammar that
forces a call when tool_choice is `required` or names a function, so its arguments always
match the tool's schema. With `auto` the model chooses and the reply is parsed leniently.
`constraint` blocks (it serialises every schema): callers run it on a worker thread.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from engine import Constraint, RequestError, structured
from web.api.errors import APIError
from web.api.schemas import ChatCompletionRequest
from web.api.structured.formats import (
    ToolFormat,
    detect,
    generic_call_text,
    generic_system,
    tool_response_text,
)

NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
PROBE = "\x1eferry-system-probe\x1e"


@dataclass(frozen=True, slots=True)
class ToolPlan:
    tools: tuple[dict[str, Any], ...]  # OpenAI's {"type": "function", "function": {...}}
    choice: str  # auto | none | required | the name of the function to call
    parallel: bool
    format: ToolFormat

    @property
    def names(self) -> frozenset[str]:
        return frozenset(t["function"]["name"] for t in self.tools)

    @property
    def parses(self) -> bool:
        """Replies are read for tool calls (not with tool_choice none)."""
        return bool(self.tools) and self.choice != "none"

    def parameters(self, name: str) -> dict[str, Any]:
        for t in self.tools:
            if t["function"]["name"] == name:
                params = t["function"].get("parameters")
                return params if params else {"type": "object", "properties": {}}
        raise KeyError(name)


def _check_tools(tools: list[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    try:
        structured.limits.check_tools(len(tools))
    except structured.limits.LimitExceeded as exc:
        raise APIError(f"tools: {exc}", param="tools", code=exc.limit) from exc
    out = []
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise APIError(f"{where}.type must be \"function\"", param=f"{where}.type")
        fn = tool.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or \
                not NAME.match(fn["name"]):
            raise APIError(f"{where}.function.name must be 1-64 letters, digits, _ . or -",
                           param=f"{where}.function.name")
        if fn["name"] in seen:
            raise APIError(f"{where}.function.name {fn['name']!r} is used twice",
                           param=f"{where}.function.name")
        seen.add(fn["name"])
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise APIError(f"{where}.function.parameters must be a JSON schema (an object)",
                           param=f"{where}.function.parameters")
        out.append({"type": "function", "function": fn})
    return tuple(out)


def _choice(value: str | dict[str, Any] | None, names: set[str]) -> str:
    if value is None:
        return "auto" if names else "none"
    if isinstance(value, str):
        if value not in ("auto", "none", "required"):
            raise APIError(f"tool_choice must be auto, none, required or a named function, "
                           f"got {value!r}", param="tool_choice")
        if value != "none" and not names:
            raise APIError(f"tool_choice {value!r} needs tools", param="tool_choice")
        return value
    fn = value.get("function") if isinstance(value, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise APIError('tool_choice must look like {"type": "function", "function": '
                       '{"name": ...}}', param="tool_choice")
    if name not in names:
        raise APIError(f"tool_choice names the function {name!r}, which is not among the "
                       "tools", param="tool_choice")
    return name


def plan(body: ChatCompletionRequest, chat_template: str | None) -> ToolPlan | None:
    """The request's tool plan; None when it has no tools and no tool messages."""
    tools = _check_tools(body.tools or [])
    has_tool_messages = any(m.role == "tool" or m.tool_calls for m in body.messages)
    if not tools and not has_tool_messages and body.tool_choice in (None, "none"):
        return None
    choice = _choice(body.tool_choice, {t["function"]["name"] for t in tools})
    parallel = body.parallel_tool_calls is not False
    return ToolPlan(tools, choice, parallel, detect(chat_template))


def _arguments(call: dict[str, Any], where: str) -> tuple[str, Any]:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise APIError(f"{where}.function.name is missing", param=f"{where}.function")
    args = fn.get("arguments", "{}")
    if isinstance(args, str):
        try:
            args = json.loads(args or "{}")
        except ValueError as exc:
            raise APIError(f"{where}.function.arguments is not valid JSON",
                           param=f"{where}.function.arguments") from exc
    return fn["name"], args


def template_input(p: ToolPlan | None, messages: list[dict[str, Any]]
                   ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, tools) for the chat template, in the plan's format."""
    native = p is not None and p.format.native
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        calls = m.get("tool_calls") or []
        if m["role"] == "tool" and not native:
            out.append({"role": "user", "content": tool_response_text(m["content"])})
        elif calls:
            parsed = [_arguments(c, f"messages[{i}].tool_calls[{j}]")
                      for j, c in enumerate(calls)]
            if native:
                out.append({"role": "assistant", "content": m["content"] or None,
                            "tool_calls": [{"id": c.get("id"), "type": "function",
                                            "function": {"name": n, "arguments": a}}
                                           for c, (n, a) in zip(calls, parsed)]})
            else:
                text = "\n".join(generic_call_text(n, a) for n, a in parsed)
                content = f"{m['content']}\n{text}" if m["content"] else text
                out.append({"role": "assistant", "content": content})
        else:
            out.append({k: v for k, v in m.items() if k != "tool_calls"})
    if p is None or not p.tools or p.choice == "none":
        return out, None
    if native:
        return out, list(p.tools)
    system = generic_system(list(p.tools))
    if out and out[0]["role"] == "system":
        out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{system}"}
    else:
        out.insert(0, {"role": "system", "content": system})
    return out, None


def check_system_prompt(render: Any) -> None:
    """The generic format lives in the system prompt: a template that drops system messages
    cannot carry tools, and the request is refused rather than the tools ignored."""
    try:
        text = render([{"role": "system", "content": PROBE}, {"role": "user", "content": "hi"}])
    except Exception:  # the template raises on a system role
        text = ""
    if PROBE not in text:
        raise APIError("this model's chat template has no tool support and no system "
                       "message to describe the tools in", param="tools",
                       code="unsupported_parameter")


def constraint(p: ToolPlan, marker_id: int | None = None) -> Constraint | None:
    """The grammar of a forced call (tool_choice required or named), else None."""
    if p.choice in ("auto", "none"):
        return None
    names = sorted(p.names) if p.choice == "required" else [p.choice]
    schemas = []
    for name in names:
        params = p.parameters(name)
        try:  # each tool's own schema first, so the 400 names the tool
            structured.json_schema_grammar(params)
        except RequestError as exc:
            raise APIError(f"tools: {name}: {exc}", param="tools", code=_code(exc)) from exc
        schemas.append(p.format.call_schema(name, params))
    grammar = p.format.grammar(schemas, p.parallel and p.choice == "required", marker_id)
    try:
        return structured.lark(grammar, "tool_call")
    except RequestError as exc:  # the tools together are past max_bytes
        raise APIError(f"tools: {exc}", param="tools", code=_code(exc)) from exc


def _code(exc: RequestError) -> str | None:
    return exc.limit if isinstance(exc, structured.limits.LimitExceeded) else None
