"""Ferry renders chat templates as transformers does, without importing it: the same text for
the same template, messages, tools and variables, and the same refusals (a template's own
raise_exception, the sandbox's)."""
from __future__ import annotations

from typing import Any

import jinja2
import pytest

from engine.execution.text.chat_render import render_chat
from engine.text.chat_template import FALLBACK_TEMPLATE
from tests.tools.synthetic_gguf import GEMMA3_TEMPLATE, QWEN2VL_TEMPLATE

CHATML_TOOLS = (
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>\n{% for tool in tools %}"
    "{{ tool | tojson }}\n{% endfor %}</tools><|im_end|>\n{% endif %}"
    "{%- for message in messages %}{%- if message.tool_calls is defined %}"
    "<|im_start|>assistant\n{% for call in message.tool_calls %}<tool_call>\n"
    "{{ call.function | tojson(indent=2, sort_keys=True) }}\n</tool_call>{% endfor %}"
    "<|im_end|>\n{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n"
    "{{ message.content }}\n</tool_response><|im_end|>\n{%- else %}"
    "<|im_start|>{{ message.role }}\n{% if message.reasoning_content is defined %}"
    "<think>{{ message.reasoning_content }}</think>{% endif %}{{ message.content }}"
    "<|im_end|>\n{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
    "{% endif %}{% endif %}")
# namespace, loop controls, the generation tag, dict(), the gpt-oss name of reasoning,
# whitespace control and a filter chain
FEATURES = (
    "{{ bos_token }}{% set ns = namespace(n=0, seen=dict(a=1)) %}"
    "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
    "{% set ns.n = ns.n + 1 %}{% if ns.n > 3 %}{% break %}{% endif %}"
    "{% if m.role == 'assistant' %}{% generation %}[{{ m.thinking | default('') }}]"
    "{{ m.content | trim | upper }}{% endgeneration %}"
    "{% else %}  {{- m.role }}: {{ m.content | replace('a', 'A') }}\n{% endif %}{% endfor %}"
    "n={{ ns.n }} keys={{ ns.seen.keys() | list }} {{ eos_token }}")
REFUSES = "{% if messages | length > 1 %}{{ raise_exception('one message only') }}{% endif %}"
YEAR = "{{ strftime_now('%Y') }} {{ messages[0].content }}"

TEMPLATES = (FALLBACK_TEMPLATE, GEMMA3_TEMPLATE, QWEN2VL_TEMPLATE, CHATML_TOOLS, FEATURES,
             REFUSES, YEAR)
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather <in> a city & \"more\"",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
CONVERSATIONS: tuple[list[dict[str, Any]], ...] = (
    [{"role": "user", "content": "Hi <b>there</b> & ünïcödé 🙂"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "a banana"},
     {"role": "assistant", "content": "  ok  ", "reasoning": "short"},
     {"role": "user", "content": "again", "name": None}],
    [{"role": "user", "content": [{"type": "text", "text": "parts"}, {"type": "image"}]}],
    [{"role": "user", "content": "Oslo?"},
     {"role": "assistant", "content": None, "tool_calls": [
         {"id": "c1", "type": "function",
          "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
     {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 3}"}],
)
SPECIALS = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "</s>"}


def transformers_render(template: str, messages: list[dict[str, Any]], **kw: Any) -> str:
    """What a transformers tokenizer's apply_chat_template(tokenize=False) renders."""
    from transformers.utils.chat_template_utils import (
        _normalize_chat_messages,
        render_jinja_template,
    )

    tools = kw.pop("tools", None)
    prompt = kw.pop("add_generation_prompt", True)
    rendered, _ = render_jinja_template(
        conversations=[_normalize_chat_messages(messages)], tools=tools, chat_template=template,
        add_generation_prompt=prompt, **{**SPECIALS, **kw})
    return str(rendered[0])


def outcome(render: Any, *args: Any, **kwargs: Any) -> str:
    try:
        return "text:" + render(*args, **kwargs)
    except Exception as exc:  # both must refuse alike
        return f"refused:{type(exc).__name__}"


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda t: str(TEMPLATES.index(t)))
def test_the_same_text_as_transformers(template: str) -> None:
    seen = set()
    for messages in CONVERSATIONS:
        for prompt in (True, False):
            for tools in (None, TOOLS):
                for extra in ({}, {"enable_thinking": False}):
                    ours = outcome(render_chat, template, [dict(m) for m in messages],
                                   add_generation_prompt=prompt, tools=tools,
                                   special_tokens=SPECIALS, **extra)
                    theirs = outcome(transformers_render, template,
                                     [dict(m) for m in messages],
                                     add_generation_prompt=prompt, tools=tools, **extra)
                    assert ours == theirs, (messages, prompt, tools, extra)
                    seen.add(ours.split(":")[0])
    if template is REFUSES:
        assert seen == {"text", "refused"}  # the template's own exception came through
    else:
        assert seen == {"text"}


def test_the_sandbox_holds() -> None:
    """Python's insides stay out of reach, as in transformers: unsafe attributes render as
    nothing or are refused, and a namespace takes no underscore name."""
    chat = [{"role": "user", "content": "x"}]
    for template in ("{{ messages.__class__ }}", "{{ ''.__class__.__mro__ }}",
                     "{{ messages.append(1) }}", "{{ namespace(_secret=1) }}"):
        ours = outcome(render_chat, template, chat)
        assert ours == outcome(transformers_render, template, chat), template
        assert ours in ("text:", "refused:SecurityError"), ours
    with pytest.raises(jinja2.exceptions.SecurityError):
        render_chat("{% set ns = namespace() %}{% set ns._x = 1 %}", chat)


def test_an_empty_conversation_is_refused() -> None:
    with pytest.raises(ValueError, match="empty conversation"):
        render_chat(FALLBACK_TEMPLATE, [])


def test_messages_are_not_changed() -> None:
    messages = [{"role": "assistant", "content": "a", "reasoning": "r", "name": None}]
    render_chat(FEATURES, messages)
    assert messages == [{"role": "assistant", "content": "a", "reasoning": "r", "name": None}]
