"""The WordPiece tokenizer of a llama.cpp `bert` GGUF (tokenizer.ggml.model "bert"), as a
transformers BertTokenizer.

llama.cpp's converter writes the vocabulary in "phantom space" form: a word-initial piece gets
a leading U+2581, a continuation piece loses its "##", control tokens stay as they are. This
undoes that. The file's normalizer flags say whether text is lowercased and stripped of
accents; a file from a converter that predates them is lowercased, as llama.cpp's WordPiece
tokenizer then always did.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.execution.text.gguf_vocab import VocabFields

PHANTOM = "\u2581"
CONTROL = 3  # llama.cpp's token type of [CLS], [SEP], ...
# token -> its metadata keys, first found wins (llama.cpp's converter writes [CLS] as BOS)
SPECIALS = {"unk_token": ("unknown_token_id",), "sep_token": ("seperator_token_id",
                                                              "eos_token_id"),
            "pad_token": ("padding_token_id",), "cls_token": ("cls_token_id", "bos_token_id"),
            "mask_token": ("mask_token_id",)}


def wordpiece_vocab(tokens: list[str], types: list[int]) -> list[str]:
    """The vocabulary as BERT spells it (each piece at its id)."""
    out = []
    for token, kind in zip(tokens, types):
        if kind == CONTROL:
            out.append(token)
        elif token.startswith(PHANTOM):
            out.append(token[len(PHANTOM):])
        else:
            out.append("##" + token)
    return out


def wordpiece_tokenizer(gguf: Path) -> Any:
    """A BertTokenizer built from the file's vocabulary, special tokens and normalizer."""
    from transformers import BertTokenizer

    fields = VocabFields(gguf)
    value = fields.value
    vocab = wordpiece_vocab(fields.tokens, fields.types)
    lowercase = value("normalizer.lowercase")
    lowercase = True if lowercase is None else bool(lowercase)
    strip = value("normalizer.strip_accents")
    specials: dict[str, Any] = {}
    for name, keys in SPECIALS.items():
        found = next((int(i) for k in keys if (i := value(k)) is not None), None)
        if found is not None and 0 <= found < len(vocab):
            specials[name] = vocab[found]
    tok = BertTokenizer(vocab={t: i for i, t in enumerate(vocab)}, do_lower_case=lowercase,
                        strip_accents=None if strip is None else bool(strip), **specials)
    if (context := fields.context_length()) is not None:
        tok.model_max_length = context
    return tok
