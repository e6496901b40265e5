"""Structured output fields -> the engine's Constraint, with 400s that name the field.

Accepted (at most one per request): OpenAI's `response_format` (`json_object`, `json_schema`
with `{name, schema, strict}`), vLLM's `guided_json` / `guided_regex` / `guided_choice` /
`guided_grammar` (Lark), and llama.cpp's `json_schema` / `grammar` (GBNF). Inputs past
engine.structured.limits are refused with a 400 naming the limit; a constraint is compiled
once here, so that a schema llguidance cannot compile, or a keyword it does not implement, is
refused before anything is queued, and the compiled constraint is what the request's choices
are submitted with. Both functions block: callers run them on worker threads.
"""
from __future__ import annotations

import json
from typing import Any

from engine import Constraint, RequestError, structured
from web.api.errors import APIError
from web.api.schemas import SamplingFields

FIELDS = ("response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
          "json_schema", "grammar")


def _schema(value: Any, param: str) -> dict[str, Any]:
    if isinstance(value, str):  # vLLM accepts the schema as JSON text too
        try:
            structured.limits.check_size("the JSON schema", value)
            value = json.loads(value)
        except structured.limits.LimitExceeded as exc:
            raise APIError(f"{param}: {exc}", param=param, code=exc.limit) from exc
        except (ValueError, RecursionError) as exc:
            raise APIError(f"{param} is not valid JSON: {exc}", param=param) from exc
    if not isinstance(value, dict):
        raise APIError(f"{param} must be a JSON schema (an object)", param=param)
    return value


def _response_format(fmt: dict[str, Any]) -> Constraint | None:
    kind = fmt.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return structured.json_object()
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict):
            raise APIError("response_format.json_schema must be an object with a `schema`",
                           param="response_format.json_schema")
        schema = spec.get("schema", {"type": "object"})  # OpenAI allows leaving it out
        return structured.json_schema(_schema(schema, "response_format.json_schema.schema"))
    raise APIError(f"response_format.type must be text, json_object or json_schema, got "
                   f"{kind!r}", param="response_format.type")


def requested(body: SamplingFields) -> tuple[Constraint, str] | None:
    """(the constraint, the field it came from), or None for free text."""
    given = [name for name in FIELDS if getattr(body, name) is not None
             and not (name == "response_format" and
                      (getattr(body, name) or {}).get("type", "text") == "text")]
    if not given:
        return None
    if len(given) > 1:
        raise APIError(f"only one structured-output field may be given, got "
                       f"{', '.join(given)}", param=given[1])
    name = given[0]
    value = getattr(body, name)
    try:
        if name == "response_format":
            c = _response_format(value)
            assert c is not None
        elif name in ("guided_json", "json_schema"):
            c = structured.json_schema(_schema(value, name))
        elif name == "guided_regex":
            c = structured.regex(value)
        elif name == "guided_choice":
            c = structured.choice(value)
        elif name == "guided_grammar":
            c = structured.lark(value)
        else:
            c = structured.gbnf(value)
    except RequestError as exc:
        raise APIError(f"{name}: {exc}", param=name, code=_code(exc)) from exc
    return c, name


def check(engine: object, constraint: Constraint, param: str) -> Constraint:
    """Compile once (a RequestError -> 400 naming `param`): the constraint, compiled; upstream
    mode checks nothing here: the upstream does."""
    checker = getattr(engine, "check_constraint", None)
    if checker is None:
        return constraint
    try:
        compiled: Constraint = checker(constraint)
    except RequestError as exc:
        raise APIError(f"{param}: {exc}", param=param,
                       code=_code(exc) or "invalid_schema") from exc
    return compiled


def _code(exc: RequestError) -> str | None:
    """A broken limit's name is the error's code (max_bytes, max_depth, ...)."""
    return exc.limit if isinstance(exc, structured.limits.LimitExceeded) else None
