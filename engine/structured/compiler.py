"""Grammars to matchers: llguidance's tokenizer view built once per model, a matcher per request.

`GrammarCompiler.matcher` runs on the caller's thread (the web handler, through
Engine.submit): compiling a schema takes milliseconds and must not stall a round. A grammar
llguidance cannot compile, or a schema keyword it does not implement, is a RequestError whose
message says why (the API turns it into a 400 naming the field).
"""
from __future__ import annotations

from typing import Any

from engine.scheduling.constraint import Constraint
from engine.scheduling.request import RequestError


class GrammarCompiler:
    def __init__(self, hf_tokenizer: Any, vocab_size: int | None = None) -> None:
        """`hf_tokenizer`: a fast Hugging Face tokenizer; `vocab_size`: the width of the
        model's logits (ids past the tokenizer's own vocabulary are never allowed)."""
        import llguidance
        import llguidance.hf

        self._llg = llguidance
        self.tokenizer = llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=vocab_size)
        self.vocab_size = int(self.tokenizer.vocab_size)

    def check(self, constraint: Constraint) -> None:
        """Raise RequestError when `constraint` does not compile."""
        self.matcher(constraint)

    def matcher(self, constraint: Constraint) -> Any:
        """A fresh llguidance LLMatcher for one request (drops the GIL while it compiles)."""
        matcher = self._llg.LLMatcher(self.tokenizer, constraint.grammar, log_level=0)
        if matcher.is_error():
            raise RequestError(f"the {describe(constraint)} cannot be used: "
                               f"{clean(matcher.get_error())}")
        return matcher


def describe(constraint: Constraint) -> str:
    return {"json_schema": "JSON schema", "json_object": "JSON object grammar",
            "regex": "regular expression", "choice": "choice list", "grammar": "grammar",
            "tool_call": "tool's parameter schema"}[constraint.kind]


def clean(error: str) -> str:
    """llguidance's message, without its internal prefixes."""
    text = error.strip()
    for prefix in ("Error building parser: ", "Error: "):
        text = text.removeprefix(prefix)
    return text[:500]
