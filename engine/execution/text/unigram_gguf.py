"""The SentencePiece Unigram tokenizer of a llama.cpp encoder GGUF (tokenizer.ggml.model "t5":
what its converter writes for XLM-RoBERTa models, multilingual-e5, bge-m3 and bge-reranker),
as a transformers XLMRobertaTokenizer.

The converter keeps the pieces with their scores and types, the SentencePiece normalizer's
compiled character map (`precompiled_charsmap`) and whether a space is put before the text
(`add_space_prefix`). Rebuilt from those, the tokenizer splits text as the model's own
tokenizer.json does, and a (query, document) pair is `<s> query </s></s> document </s>`, as
an XLM-RoBERTa cross-encoder was trained on.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.execution.text.gguf_vocab import VocabFields

UNKNOWN, CONTROL = 2, 3  # llama.cpp's token types
# token -> its metadata key (gguf-py's SpecialVocab writes XLM-RoBERTa's <s> as BOS and CLS,
# </s> as EOS and SEP)
SPECIALS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id",
            "sep_token": "seperator_token_id", "cls_token": "cls_token_id",
            "unk_token": "unknown_token_id", "pad_token": "padding_token_id",
            "mask_token": "mask_token_id"}


def unigram_tokenizer(gguf: Path) -> Any:
    """An XLMRobertaTokenizer over the file's pieces and scores, its character map and
    space prefix, with the file's special tokens."""
    from tokenizers import normalizers
    from tokenizers.models import Unigram
    from transformers import XLMRobertaTokenizer

    fields = VocabFields(gguf)
    value, tokens, types = fields.value, fields.tokens, fields.types
    scores = [float(s) for s in value("scores") or [0.0] * len(tokens)]
    if not tokens:
        raise ValueError(f"{gguf}: its tokenizer has no pieces")
    unk = value("unknown_token_id")
    if unk is None:
        unk = next((i for i, t in enumerate(types) if t == UNKNOWN), 0)
    specials: dict[str, Any] = {}
    for name, key in SPECIALS.items():
        found = value(key)
        if found is not None and 0 <= int(found) < len(tokens):
            specials[name] = tokens[int(found)]
    specials.setdefault("sep_token", specials.get("eos_token", "</s>"))
    specials.setdefault("cls_token", specials.get("bos_token", "<s>"))
    charsmap = value("precompiled_charsmap")
    prefix = value("add_space_prefix")
    vocab = list(zip(tokens, scores, strict=True))
    tok = XLMRobertaTokenizer(
        vocab=vocab, add_prefix_space=True if prefix is None else bool(prefix), **specials)
    backend: Any = tok._tokenizer  # the Rust tokenizer the class built
    # the class counts the unknown piece at 3 (XLM-RoBERTa's); a file may say otherwise
    backend.model = Unigram(vocab, unk_id=int(unk), byte_fallback=False)
    if charsmap is not None:  # SentencePiece's normalization (NFKC and its own folds)
        backend.normalizer = normalizers.Precompiled(bytes(charsmap))
    controls = [t for t, kind in zip(tokens, types, strict=True) if kind == CONTROL]
    tok.add_special_tokens({"additional_special_tokens": [
        t for t in controls if t not in specials.values()]})
    if (context := fields.context_length()) is not None:
        tok.model_max_length = context
    return tok
