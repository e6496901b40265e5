"""Bounds on what a request may ask to compile, checked before anything is converted or compiled.

llguidance recurses along chains of rules and `$ref`s; a long enough chain overflows a
thread's stack and kills the process. The checks here are linear scans of the request's text:
its size in bytes, its nesting depth, its number of rules or `$ref`s, choices and tools. A
broken bound is a `LimitExceeded` (a RequestError: the API's 400) that names the limit.
The compile threads' stack (engine.structured.threads) holds the deepest grammar these
bounds let through, and llguidance's own limits (`parser_limits`) bound compile time and
memory.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.scheduling.request import RequestError


@dataclass(frozen=True, slots=True)
class GrammarLimits:
    max_bytes: int = 256 * 1024  # a grammar, regex, JSON schema, choice list or tool set
    max_depth: int = 64  # nesting: JSON levels of a schema, brackets of a grammar or regex
    max_rules: int = 4096  # rules of a grammar, `$ref`s of a schema
    max_choices: int = 1024  # guided_choice options
    max_tools: int = 128  # tools of one chat request (OpenAI's bound)
    # llguidance's own bounds (LLParserLimits): lexer states cost 1-2 KB each; the rest
    # bound the work of one compile and of one token's mask
    max_lexer_states: int = 50_000
    max_grammar_size: int = 500_000
    max_items_in_row: int = 2_000
    step_max_items: int = 50_000
    initial_lexer_fuel: int = 1_000_000
    step_lexer_fuel: int = 200_000


LIMITS = GrammarLimits()


class LimitExceeded(RequestError):
    """A request's grammar input breaks one of GrammarLimits (`limit`: the field's name)."""

    def __init__(self, what: str, found: str, limit: str, limits: GrammarLimits) -> None:
        super().__init__(f"{what} {found}: the limit is {getattr(limits, limit)} ({limit})")
        self.limit = limit


def parser_limits(limits: GrammarLimits = LIMITS) -> Any:
    import llguidance

    return llguidance.LLParserLimits(
        max_lexer_states=limits.max_lexer_states, max_grammar_size=limits.max_grammar_size,
        max_items_in_row=limits.max_items_in_row,
        step_max_items=limits.step_max_items, initial_lexer_fuel=limits.initial_lexer_fuel,
        step_lexer_fuel=limits.step_lexer_fuel)


def check_size(what: str, text: str, limits: GrammarLimits = LIMITS) -> None:
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limits.max_bytes:
        raise LimitExceeded(what, f"is {size} bytes", "max_bytes", limits)


def check_schema(schema: Any, limits: GrammarLimits = LIMITS) -> None:
    """Nesting depth, `$ref` count and size of a parsed JSON schema (an explicit stack: a
    schema deeper than Python's recursion limit is refused, not a RecursionError). The size
    counted is a lower bound of its JSON text's (strings, keys, quotes and brackets): a schema
    far past the limit is refused here, before json.dumps holds Python's lock to write it."""
    refs, size, stack = 0, 0, [(schema, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > limits.max_depth:
            raise LimitExceeded("the JSON schema", "nests too deeply", "max_depth", limits)
        if isinstance(value, dict):
            if "$ref" in value:
                refs += 1
                if refs > limits.max_rules:
                    raise LimitExceeded("the JSON schema", "has too many $refs", "max_rules",
                                        limits)
            size += 2 + sum(len(k) + 3 for k in value if isinstance(k, str))
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            size += 2
            stack.extend((v, depth + 1) for v in value)
        elif isinstance(value, str):
            size += len(value) + 2
    if size > limits.max_bytes:
        raise LimitExceeded("the JSON schema", f"is over {limits.max_bytes} bytes",
                            "max_bytes", limits)


# a rule or terminal definition at the start of a line: `name:`, `?name:`, `NAME.2:`,
# `name[lazy]:`, `name{x}:` (Lark) or `name ::=` (GBNF)
_LARK_RULE = re.compile(r"^[ \t]*[?!]?[A-Za-z_][\w]*(?:\{[^}\n]*\})?(?:\.-?\d+)?[ \t]*"
                        r"(?:\[[^\]\n]*\])?[ \t]*:", re.MULTILINE)
_GBNF_RULE = re.compile(r"^[ \t]*[A-Za-z_][\w-]*[ \t]*::=", re.MULTILINE)
_OPEN, _CLOSE = "([{", ")]}"


def check_grammar(what: str, text: str, gbnf: bool = False,
                  limits: GrammarLimits = LIMITS) -> None:
    """Size, rule count and bracket depth of a Lark (or GBNF) grammar."""
    check_size(what, text, limits)
    rules = sum(1 for _ in (_GBNF_RULE if gbnf else _LARK_RULE).finditer(text))
    if rules > limits.max_rules:
        raise LimitExceeded(what, f"has {rules} rules", "max_rules", limits)
    _check_depth(what, text, limits)


def check_regex(what: str, text: str, limits: GrammarLimits = LIMITS) -> None:
    check_size(what, text, limits)
    _check_depth(what, text, limits)


def check_choices(options: Sequence[str], limits: GrammarLimits = LIMITS) -> None:
    if len(options) > limits.max_choices:
        raise LimitExceeded("the choice list", f"has {len(options)} choices", "max_choices",
                            limits)
    size = sum(len(o.encode("utf-8", "surrogatepass")) for o in options)
    if size > limits.max_bytes:
        raise LimitExceeded("the choice list", f"is {size} bytes", "max_bytes", limits)


def check_tools(count: int, limits: GrammarLimits = LIMITS) -> None:
    if count > limits.max_tools:
        raise LimitExceeded("the request", f"has {count} tools", "max_tools", limits)


def _check_depth(what: str, text: str, limits: GrammarLimits) -> None:
    """Bracket depth outside quoted strings (a backslash escapes the next character)."""
    depth, quote, escaped = 0, "", False
    for ch in text:
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif quote:
            quote = "" if ch == quote else quote
        elif ch == '"':
            quote = ch
        elif ch in _OPEN:
            depth += 1
            if depth > limits.max_depth:
                raise LimitExceeded(what, "nests brackets too deeply", "max_depth", limits)
        elif ch in _CLOSE:
            depth = max(0, depth - 1)
