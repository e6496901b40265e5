"""Grammar inputs shaped like the ones that overflowed llguidance's stack: chains of `$ref`s
and of rules, and deeply nested schemas (tests of the grammar limits and compile threads)."""
from __future__ import annotations

from typing import Any


def nested(depth: int) -> dict[str, Any]:
    """A schema of `depth` arrays in one another (two JSON levels each)."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


def ref_chain(links: int) -> dict[str, Any]:
    """A schema whose `$defs` refer to one another in a chain of `links` `$ref`s."""
    defs: dict[str, Any] = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(links)}
    defs[f"d{links}"] = {"type": "string"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def rule_chain(rules: int) -> str:
    """A Lark grammar of `rules` + 2 rules, each the next one; its only sentence is "x"."""
    return "start: r0\n" + "".join(f"r{i}: r{i + 1}\n" for i in range(rules)) + \
        f'r{rules}: "x"\n'
