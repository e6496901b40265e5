"""Constraints from the API's fields: JSON schemas, any JSON object, regexes, choices, Lark.

Each builder first checks its input against engine.structured.limits (a 400 naming the
limit), then returns a `Constraint` holding llguidance's grammar text; nothing is compiled
here (engine.structured.compiler does that, once per grammar, with the model's tokenizer).
Builders block (GBNF is converted in Python): callers run them off the event loop.
JSON is compact (no free whitespace): a small model cannot wander off in blank lines, and
the output is still plain JSON.
"""
from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from engine.scheduling.constraint import Constraint, ConstraintKind
from engine.scheduling.request import RequestError
from engine.structured import limits

JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False, "key_separator": ": ",
                                "item_separator": ", "}
# keywords that constrain nothing the decoder must enforce (docs, ids, annotations)
ANNOTATIONS = frozenset({
    "$schema", "$id", "$comment", "title", "description", "default", "examples",
    "deprecated", "readOnly", "writeOnly", "contentMediaType", "contentEncoding", "strict",
    "$anchor", "discriminator", "x-guidance"})


def _llg() -> Any:
    import llguidance

    return llguidance


def json_schema_grammar(schema: dict[str, Any]) -> str:
    """The grammar of output that validates against `schema` (a RequestError when the schema
    is not an object or not JSON)."""
    if not isinstance(schema, dict):
        raise RequestError("the JSON schema must be an object")
    limits.check_schema(schema)  # depth first: json.dumps recurses
    try:
        text = json.dumps(schema)
    except (ValueError, TypeError) as exc:
        raise RequestError(f"the JSON schema is not valid JSON: {exc}") from exc
    limits.check_size("the JSON schema", text)
    try:
        return str(_llg().LLMatcher.grammar_from_json_schema(text, defaults=JSON_OPTIONS))
    except (ValueError, TypeError) as exc:
        raise RequestError(f"the JSON schema is not valid JSON: {exc}") from exc


def json_schema(schema: dict[str, Any], kind: ConstraintKind = "json_schema") -> Constraint:
    return Constraint(kind, json_schema_grammar(schema))


def json_object() -> Constraint:
    """Any JSON object (OpenAI's JSON mode)."""
    return Constraint("json_object", json_schema_grammar({"type": "object"}))


def regex(pattern: str) -> Constraint:
    limits.check_regex("the regular expression", pattern)
    return Constraint("regex", str(_llg().LLMatcher.grammar_from_regex(pattern)))


def choice(options: Sequence[str]) -> Constraint:
    """Exactly one of `options` (vLLM's guided_choice)."""
    if not options or not all(isinstance(o, str) for o in options):
        raise RequestError("the choices must be a non-empty list of strings")
    limits.check_choices(options)
    alternatives = " | ".join(json.dumps(o) for o in options)
    return Constraint("choice", str(_llg().LLMatcher.grammar_from_lark(
        f"start: {alternatives}")))


def lark(grammar: str, kind: ConstraintKind = "grammar") -> Constraint:
    """A Lark grammar in llguidance's dialect (`%json {...}` embeds a schema). A tool call's
    grammar is Ferry's own around schemas checked one by one: only its size is bounded."""
    if kind == "tool_call":
        limits.check_size("the tools' grammar", grammar)
    else:
        limits.check_grammar("the grammar", grammar)
    return Constraint(kind, str(_llg().LLMatcher.grammar_from_lark(grammar)))


def gbnf(grammar: str) -> Constraint:
    """A llama.cpp GBNF grammar (its `grammar` field), converted to Lark by llguidance."""
    from llguidance.gbnf_to_lark import gbnf_to_lark

    limits.check_grammar("the grammar", grammar, gbnf=True)
    try:
        converted = gbnf_to_lark(grammar)
    except Exception as exc:  # the converter raises plain exceptions on bad input
        raise RequestError(f"the grammar could not be read as GBNF: {exc}") from exc
    return lark(converted)


def after_thinking(constraint: Constraint, close: str) -> Constraint:
    """The same constraint for a prompt that opened a think block: the model's reasoning
    first, free text up to `close` (the tag that ends the block; lazy: the first one ends
    it), a newline, then the constrained answer. Without it a thinking model could not think,
    and its whole reply would be read as reasoning."""
    try:
        inner = json.loads(constraint.grammar)["grammars"]  # llguidance's grammar JSON
    except (ValueError, TypeError, KeyError):
        inner = [{"name": "answer", "lark_grammar": constraint.grammar}]  # Lark text
    inner = [dict(g) for g in inner]
    inner[0]["name"] = name = inner[0].get("name") or "answer"
    tag = re.escape(close).replace("/", "\\/")
    think = {"name": "thinking",
             "lark_grammar": f'start: think "\\n" @{name}\nthink[lazy]: /(.|\\n)*{tag}/\n'}
    return Constraint(constraint.kind, json.dumps({"grammars": [think, *inner]}))
