"""A GGUF's tokenizer fields (`tokenizer.ggml.*`), read for the vocabularies transformers does
not read from a GGUF (engine.execution.text.wordpiece_gguf, unigram_gguf)."""
from __future__ import annotations

from pathlib import Path
from typing import Any


class VocabFields:
    def __init__(self, gguf: Path) -> None:
        import gguf as gguf_py

        self.reader = gguf_py.GGUFReader(str(gguf), "r")
        self.tokens = [str(t) for t in self.value("tokens") or []]
        self.types = [int(t) for t in self.value("token_type") or [1] * len(self.tokens)]

    def value(self, key: str) -> Any:
        """tokenizer.ggml.`key`'s contents; None where the file has none."""
        field = self.reader.fields.get(f"tokenizer.ggml.{key}")
        return None if field is None else field.contents()

    def context_length(self) -> int | None:
        """The architecture's context length, a tokenizer's model_max_length."""
        arch = self.reader.fields.get("general.architecture")
        field = None if arch is None else \
            self.reader.fields.get(f"{arch.contents()}.context_length")
        return None if field is None else int(field.contents())
