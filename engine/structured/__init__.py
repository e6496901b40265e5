"""Grammar-constrained decoding with llguidance: constraints from the API's fields
(`grammars`, bounded by `limits`) and per-request matchers (`compiler`, compiling on
`threads`). Imports llguidance lazily, never torch;
the masks are applied in engine.execution.sampling.grammar_masks."""
from engine.structured import limits
from engine.structured.compiler import GrammarCompiler
from engine.structured.grammars import (
    after_thinking,
    choice,
    gbnf,
    json_object,
    json_schema,
    json_schema_grammar,
    lark,
    regex,
)

__all__ = ["GrammarCompiler", "after_thinking", "choice", "gbnf", "json_object", "json_schema",
           "json_schema_grammar", "lark", "limits", "regex"]
