"""A chat request's prompt and constraint: messages, tools and structured output together.

Upstream mode has no tokenizer here: the messages, tools and structured-output fields go to
the upstream as they came (`UpstreamPrompt.extra`), and the replies' tool calls come back
through the gateway in the generic format (web/gateway/client.py), read like a local reply.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import anyio
from jinja2 import TemplateError

from engine import Constraint, ImageInput, Reasoning, structured
from web.api.errors import APIError, unsupported
from web.api.params import check_chat
from web.api.reasoning import enable_thinking
from web.api.schemas import ChatCompletionRequest, SamplingFields
from web.api.structured import fields, tools
from web.api.structured.formats import FORMATS
from web.api.vision import image_parts, prompt_with_images
from web.services import Services

# the model too: the gateway routes by it (web/gateway/queue.py)
PASSED_UPSTREAM = ("model", "tools", "tool_choice", "parallel_tool_calls",
                   "chat_template_kwargs", *fields.FIELDS)


@dataclass(frozen=True, slots=True)
class ChatInput:
    ids: list[int]
    constraint: Constraint | None
    tools: tools.ToolPlan | None  # replies are read for tool calls when it `parses`
    reasoning: Reasoning | None = None  # how a thinking model's reply carries its reasoning
    images: tuple[ImageInput, ...] = ()  # a vision model's images, placed in `ids`


def upstream(s: Services) -> bool:
    return getattr(s.tokenizer, "hf", None) is None


def passthrough(body: SamplingFields) -> dict[str, Any]:
    """The fields an upstream is sent as they came (upstream mode)."""
    return {name: getattr(body, name) for name in PASSED_UPSTREAM
            if getattr(body, name, None) is not None}


async def constraint_of(body: SamplingFields, s: Services) -> Constraint | None:
    """The structured-output constraint of either endpoint, compiled (once: its choices
    share it). Built and compiled on a worker thread, never on the event loop."""
    asked = await anyio.to_thread.run_sync(fields.requested, body)
    if asked is None or upstream(s):
        return None
    return await anyio.to_thread.run_sync(fields.check, s.engine, *asked)


async def chat_input(data: ChatCompletionRequest, s: Services,
                     may_fetch: bool = False) -> ChatInput:
    messages, thinking = check_chat(data, s.config), enable_thinking(data)
    if upstream(s):
        parts = image_parts(messages)
        if parts:
            raise unsupported(parts[0][0], "images through an upstream")
        plan = tools.plan(data, None)
        plan = plan and tools.ToolPlan(plan.tools, plan.choice, plan.parallel,
                                       FORMATS["generic"])
        prompt: Any = s.tokenizer.apply_chat_template(messages)
        prompt.extra = passthrough(data)
        await anyio.to_thread.run_sync(fields.requested, data)  # a 400 for a malformed field
        return ChatInput(prompt, None, plan)
    hf = s.tokenizer.hf
    plan = tools.plan(data, getattr(hf, "chat_template", None))
    template_messages, template_tools = tools.template_input(plan, messages)
    if plan is not None and plan.parses and not plan.format.native:
        tools.check_system_prompt(lambda ms: s.tokenizer.render_chat(ms))
    marker = _marker(s, plan) if plan is not None else None
    # built on a worker thread: GBNF is converted in Python, schemas are serialised
    forced, asked = await anyio.to_thread.run_sync(
        lambda: (tools.constraint(plan, marker) if plan is not None else None,
                 fields.requested(data)))
    if asked is not None and plan is not None and plan.parses:
        raise APIError(f"{asked[1]} cannot be combined with tools (unless tool_choice is "
                       "none)", param=asked[1])
    try:
        prompt = await prompt_with_images(
            template_messages, s.engine, s.config, data.model or s.model_name,
            lambda ms, **kw: s.tokenizer.apply_chat_template(ms, tools=template_tools,
                                                             enable_thinking=thinking, **kw),
            may_fetch)
    except (TemplateError, ValueError) as exc:
        raise APIError(f"the chat template refused these messages: {exc}",
                       param="messages") from exc
    ids, images = prompt.ids, prompt.images
    reasoning = s.tokenizer.reasoning_for(ids)
    if forced is not None:
        forced = await anyio.to_thread.run_sync(_compiled, s, forced, "tools", reasoning)
        return ChatInput(ids, forced, plan, reasoning, images)
    if asked is not None:
        constraint = await anyio.to_thread.run_sync(_compiled, s, *asked, reasoning)
        return ChatInput(ids, constraint, plan, reasoning, images)
    return ChatInput(ids, None, plan, reasoning, images)


def _compiled(s: Services, constraint: Constraint, param: str,
              reasoning: Reasoning | None) -> Constraint:
    """On a worker thread: the constraint as the prompt needs it, compiled (a 400 naming
    `param` when it does not compile)."""
    return fields.check(s.engine, _after_thinking(constraint, reasoning), param)


def _after_thinking(constraint: Constraint, reasoning: Reasoning | None) -> Constraint:
    """A prompt that opened a think block: the grammar lets the model think first."""
    if reasoning is None or not reasoning.started:
        return constraint
    return structured.after_thinking(constraint, reasoning.close)


def _marker(s: Services, plan: tools.ToolPlan) -> int | None:
    """The token id of Mistral's [TOOL_CALLS] (a special token the grammar names by id)."""
    if plan.format.name != "mistral":
        return None
    ids = s.tokenizer.encode("[TOOL_CALLS]", add_special_tokens=False)
    return ids[0] if len(ids) == 1 else None
