"""Small XLM-RoBERTa-like models for the tests: a tokenizer folder (a SentencePiece Unigram
vocabulary: <s>, <pad>, </s>, <unk> first, <mask> last, scored pieces between) trained by
`tokenizers` on a few sentences in three languages and saved by transformers'
XLMRobertaTokenizer, optionally with a SentencePiece normalizer's compiled character map as
the real ones carry; a seeded random cross-encoder over it (bge-reranker's layout) and
transformers' own scores of (query, document) pairs."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CORPUS = [
    "The cat sits on the mat.", "A quick brown fox jumps over the lazy dog.",
    "Stock markets fell sharply on Monday, and nobody knew why.",
    "Ferry carries cars and people across the river every morning.",
    "What do embeddings measure? They measure meaning.",
    "Wie spät ist es? Die Fähre fährt um acht Uhr.", "Le chat dort sur le tapis.",
    "query: how much protein should a female eat", "passage: As a general guideline",
    "Naïve café, 1,234 cups!", "word " * 20,
]


def unigram_tokenizer_folder(out: Path, vocab_size: int = 400,
                             charsmap: bytes | None = None) -> Path:
    """The tokenizer folder at `out` (tokenizer.json, tokenizer_config.json)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import XLMRobertaTokenizer

    trainer = trainers.UnigramTrainer(vocab_size=vocab_size, unk_token="<unk>",
                                      special_tokens=["<s>", "<pad>", "</s>", "<unk>"])
    raw = Tokenizer(models.Unigram())
    raw.pre_tokenizer = pre_tokenizers.Metaspace()
    raw.train_from_iterator(CORPUS * 4, trainer)
    pieces = [(str(p), float(s)) for p, s in json.loads(raw.to_str())["model"]["vocab"]]
    tok = XLMRobertaTokenizer(vocab=[*pieces, ("<mask>", 0.0)],
                              _spm_precompiled_charsmap=charsmap)
    tok.save_pretrained(str(out))
    for name in ("special_tokens_map.json",):  # transformers 5 writes none; the tests copy it
        if not (out / name).exists():
            (out / name).write_text("{}")
    return out


def cross_encoder(folder: Path, context: int = 128) -> Any:
    """A sequence classifier with one label over the tokenizer at `folder` (`context`
    positions after the padding id + 1, one token type), saved there; returns it."""
    import torch
    from transformers import (
        AutoTokenizer,
        XLMRobertaConfig,
        XLMRobertaForSequenceClassification,
    )

    from tests.tools.random_hf import random_hf

    tok = AutoTokenizer.from_pretrained(folder)
    config = XLMRobertaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                              num_attention_heads=4, intermediate_size=64, num_labels=1,
                              initializer_range=0.2, type_vocab_size=1,
                              pad_token_id=tok.pad_token_id,
                              max_position_embeddings=context + tok.pad_token_id + 1,
                              architectures=["XLMRobertaForSequenceClassification"])
    torch.manual_seed(0)
    model = random_hf(config, XLMRobertaForSequenceClassification).eval()
    model.save_pretrained(folder)
    return model


def reference_scores(model: Any, folder: Path, query: str, documents: list[str],
                     context: int = 128) -> list[float]:
    """transformers' relevance of each document: sigmoid of the classifier's logit over
    `<s> query </s></s> document </s>`, the document cut to the context."""
    import torch
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    with torch.inference_mode():
        batch = tok([query] * len(documents), documents, padding=True,
                    truncation="only_second", max_length=context, return_tensors="pt")
        batch.pop("token_type_ids", None)
        return [float(v) for v in torch.sigmoid(model(**batch).logits[:, 0])]
