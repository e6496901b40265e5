"""The bounds on grammar inputs: each one refuses what passes it, naming the limit, and lets
through what stays within it (nothing here compiles)."""
from __future__ import annotations

import json
from typing import Any

import pytest

from engine import RequestError, structured
from engine.structured.limits import LIMITS, GrammarLimits, LimitExceeded, check_tools
from tests.tools.grammar_chains import nested, ref_chain, rule_chain


def refused(limit: str, build: Any, *args: Any) -> LimitExceeded:
    with pytest.raises(LimitExceeded) as info:
        build(*args)
    assert info.value.limit == limit
    assert f"({limit})" in str(info.value) and str(getattr(LIMITS, limit)) in str(info.value)
    return info.value


def test_schema_depth_refs_and_size() -> None:
    structured.json_schema(nested(LIMITS.max_depth // 2 - 1))  # each level: two JSON levels
    refused("max_depth", structured.json_schema, nested(LIMITS.max_depth))
    refused("max_depth", structured.json_schema, nested(100_000))  # no RecursionError
    structured.json_schema(ref_chain(LIMITS.max_rules - 1))
    refused("max_rules", structured.json_schema, ref_chain(LIMITS.max_rules))
    big = {"type": "string", "description": "x" * LIMITS.max_bytes}
    refused("max_bytes", structured.json_schema, big)
    # the crasher: a ~700 KB chain of $refs
    assert len(json.dumps(ref_chain(20_000))) > 700_000
    refused("max_rules", structured.json_schema, ref_chain(20_000))


def test_schema_far_past_the_size_is_refused_before_it_is_written(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Writing a 750 KB schema as JSON holds Python's lock for tens of milliseconds: the walk
    that checks depth counts a lower bound of the size and refuses it first."""
    import engine.structured.grammars as grammars

    def written(*_: Any, **__: Any) -> str:
        raise AssertionError("json.dumps ran on a schema the walk could refuse")
    many = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(20_000)}}
    monkeypatch.setattr(grammars.json, "dumps", written)
    refused("max_bytes", structured.json_schema, many)


def test_lark_rules_depth_and_size() -> None:
    structured.lark(rule_chain(LIMITS.max_rules - 2))
    refused("max_rules", structured.lark, rule_chain(LIMITS.max_rules))
    refused("max_rules", structured.lark, "start: a\n" + "".join(
        f"  ?r{i}.2 [lazy] : \"x\"\n" for i in range(LIMITS.max_rules)))  # every spelling
    refused("max_depth", structured.lark, "start: " + "(" * 65 + '"x"' + ")" * 65)
    structured.lark('start: "((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((("')
    refused("max_bytes", structured.lark, 'start: "' + "x" * LIMITS.max_bytes + '"')
    # the crasher: a ~400 KB chain of rules
    refused("max_bytes", structured.lark, rule_chain(30_000))
    structured.lark("x" * 100, "tool_call")  # Ferry's own tool grammar: size only
    refused("max_bytes", structured.lark, "x" * (LIMITS.max_bytes + 1), "tool_call")


def test_gbnf_is_bounded_before_and_after_conversion() -> None:
    rules = "".join(f"r{i} ::= r{i + 1}\n" for i in range(LIMITS.max_rules))
    refused("max_rules", structured.gbnf, f"root ::= r0\n{rules}r{LIMITS.max_rules} ::= \"x\"")
    refused("max_depth", structured.gbnf, "root ::= " + "(" * 65 + '"x"' + ")" * 65)
    assert structured.gbnf('root ::= "yes" | "no"').kind == "grammar"


def test_regex_choices_and_tools() -> None:
    refused("max_depth", structured.regex, "(" * 65 + "x" + ")" * 65)
    refused("max_bytes", structured.regex, "x" * (LIMITS.max_bytes + 1))
    structured.choice([str(i) for i in range(LIMITS.max_choices)])
    refused("max_choices", structured.choice, [str(i) for i in range(LIMITS.max_choices + 1)])
    refused("max_bytes", structured.choice, ["x" * (LIMITS.max_bytes // 2 + 1)] * 2)
    check_tools(LIMITS.max_tools)
    refused("max_tools", check_tools, LIMITS.max_tools + 1)


def test_a_limit_is_a_request_error_with_its_own_bounds() -> None:
    small = GrammarLimits(max_bytes=10)
    with pytest.raises(RequestError, match=r"is 11 bytes: the limit is 10 \(max_bytes\)"):
        structured.limits.check_size("the grammar", "x" * 11, small)
    structured.limits.check_size("the grammar", "é" * 5, small)  # bytes, not characters
    with pytest.raises(LimitExceeded):
        structured.limits.check_size("the grammar", "é" * 6, small)
