"""What a constrained request's output must match: the grammar's kind and its source text.

Pure data, so the scheduler and the simulator stay free of llguidance; engine.structured
turns it into a matcher (one per request) and engine.execution applies its masks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# json_schema / json_object: response_format; regex / choice / grammar: vLLM's and
# llama.cpp's fields; tool_call: a tool call forced by tool_choice required or named
ConstraintKind = Literal["json_schema", "json_object", "regex", "choice", "grammar",
                         "tool_call"]


@dataclass(frozen=True, slots=True)
class Constraint:
    kind: ConstraintKind
    grammar: str  # llguidance's grammar JSON (what LLMatcher compiles)
