"""What a constrained request's output must match: the grammar's kind and its source text.

Pure data, so the scheduler and the simulator stay free of llguidance; engine.structured
compiles it (once per distinct grammar), each request gets a copy of the compiled matcher,
and engine.execution applies its masks.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

# json_schema / json_object: response_format; regex / choice / grammar: vLLM's and
# llama.cpp's fields; tool_call: a tool call forced by tool_choice required or named
ConstraintKind = Literal["json_schema", "json_object", "regex", "choice", "grammar",
                         "tool_call"]


@dataclass(frozen=True, slots=True)
class Constraint:
    kind: ConstraintKind
    grammar: str  # llguidance's grammar JSON (what LLMatcher compiles)
    # engine.structured's compiled matcher once checked (opaque here): submitting the
    # constraint, once per choice, copies it instead of compiling again
    compiled: object | None = field(default=None, compare=False, repr=False)
