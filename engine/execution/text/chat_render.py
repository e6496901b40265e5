"""Chat templates rendered as transformers renders them, without importing transformers.

A chat template is untrusted Jinja from a model file. transformers renders it in a sandbox
with a fixed set of helpers, and every model's template is written against that set: trimmed
blocks, `tojson` without HTML escaping, `raise_exception`, `strftime_now`, `namespace` and
`dict` that refuse underscore names, loop controls and the `{% generation %}` tag. Ferry
serves a GGUF's tokenizer with the Rust tokenizer alone (engine.execution.text.plain): the
`transformers` package holds ~20 MB of modules for the process's life, which serving a
plain tokenizer does not need. So the same environment is built here, on jinja2 alone, and a
model's tokenizer folder is only served this way once its renders were compared with
transformers' (engine.execution.text.tokenizer.same_plain).
"""
from __future__ import annotations

import datetime
import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

# the names a message's reasoning comes under; templates read the first (gpt-oss's "thinking")
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks the assistant's part for training
    masks; rendering a prompt writes its body as it is."""

    tags = {"generation"}  # noqa: RUF012 (jinja declares it a plain set)

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return str(caller())


class TemplateNamespace(jinja2.utils.Namespace):
    """`namespace(...)` that refuses underscore attributes (no reach into Python's insides)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # jinja's signature: `self` may be a key
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            TemplateNamespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        TemplateNamespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"Chat templates cannot store underscore-prefixed attributes on a namespace, "
                f"but got {name!r}. Please rename the attribute.")


class TemplateDict:
    """`dict(...)` and `dict.fromkeys(...)`, and nothing else of the type."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # jinja's own escapes <, > and & for HTML, which a prompt must not see
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.datetime.now().strftime(format)


@functools.lru_cache(maxsize=32)
def compiled(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now,
                       dict=TemplateDict(), namespace=TemplateNamespace)
    return env.from_string(template)


def plain(value: Any) -> Any:
    """What a template may see: JSON's types only, rebuilt (subclasses stripped to their
    base type, tuples kept, anything else an inert string)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {plain(k): plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    return f"<{type(value).__name__}>"


def _message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message as templates get it: keys whose value is None dropped (templates test for a
    key, and would print "None"), and its reasoning under every name templates read."""
    out = {k: plain(v) for k, v in message.items() if v is not None}
    reasoning = next((out[k] for k in REASONING_FIELDS if out.get(k) is not None), None)
    if reasoning is not None:
        out = {"thinking": reasoning, **out, "reasoning_content": reasoning}
    return out


def render_chat(template: str, messages: Sequence[Mapping[str, Any]], *,
                add_generation_prompt: bool = True,
                tools: Sequence[Mapping[str, Any]] | None = None,
                special_tokens: Mapping[str, str] | None = None, **variables: Any) -> str:
    """The text `template` makes of `messages`. `special_tokens` (bos_token, eos_token, ...)
    and `variables` (enable_thinking, ...) are visible to it, the variables winning."""
    if not messages:
        raise ValueError("Cannot apply chat template to an empty conversation. "
                         "Provide at least one message.")
    for message in messages:
        if not isinstance(message, Mapping):
            raise TypeError(f"Chat messages should be dicts, but got {message!r}.")
    context = plain({**(special_tokens or {}), **variables})
    return compiled(template).render(
        messages=[_message(m) for m in messages],
        tools=plain(list(tools)) if tools is not None else None, documents=None,
        add_generation_prompt=add_generation_prompt, **context)
