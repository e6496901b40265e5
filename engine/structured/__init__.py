"""Grammar-constrained decoding with llguidance: constraints from the API's fields
(`grammars`) and per-request matchers (`compiler`). Imports llguidance lazily, never torch;
the masks are applied in engine.execution.sampling.grammar_masks."""
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
           "json_schema_grammar", "lark", "regex"]
