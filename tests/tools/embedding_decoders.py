"""Tiny embedding models as sentence-transformers folders: a seeded random Qwen3 (last-token
pooling, as Qwen3-Embedding), Gemma 3 text with bidirectional attention, mean pooling and two
Dense modules (as EmbeddingGemma), nomic-bert (rotary, SwiGLU, mean pooling, as
nomic-embed-text) and XLM-RoBERTa (mean pooling, as multilingual-e5), built by transformers
and saved by sentence-transformers itself. The tokenizer is all-MiniLM's (any tokenizer does:
both sides read the same files)."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from tests.tools.random_hf import random_hf

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
WINDOW = 4  # Gemma's sliding layers: shorter than the test inputs, so the window matters


def _config(family: str, vocab: int, pad: int) -> tuple[Any, Any]:
    from transformers import (
        Gemma3TextConfig,
        Gemma3TextModel,
        NomicBertConfig,
        NomicBertModel,
        Qwen3Config,
        Qwen3Model,
        XLMRobertaConfig,
        XLMRobertaModel,
    )

    if family == "nomic_bert":
        return NomicBertConfig(vocab_size=vocab, hidden_size=64, intermediate_size=96,
                               num_hidden_layers=2, num_attention_heads=4,
                               max_position_embeddings=512), NomicBertModel
    if family == "xlm_roberta":  # 512 positions after the tokenizer's padding id + 1
        return XLMRobertaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=96,
                                num_hidden_layers=2, num_attention_heads=4, type_vocab_size=1,
                                pad_token_id=pad, max_position_embeddings=512 + pad + 1,
                                add_pooling_layer=False), XLMRobertaModel
    if family == "qwen3":
        return Qwen3Config(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=16, max_position_embeddings=512), Qwen3Model
    if family == "embeddinggemma":  # EmbeddingGemma's layout: five sliding layers, one full
        return Gemma3TextConfig(
            vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
            num_attention_heads=4, num_key_value_heads=1, head_dim=16,
            max_position_embeddings=512, sliding_window=WINDOW, query_pre_attn_scalar=16,
            use_bidirectional_attention=True), Gemma3TextModel
    return Gemma3TextConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
        sliding_window=WINDOW, query_pre_attn_scalar=16, use_bidirectional_attention=True,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"]
    ), Gemma3TextModel


def embedding_decoder(family: str, tokenizer_dir: Path, out: Path) -> Path:
    """`family` ("qwen3", "gemma3_text", "embeddinggemma", "nomic_bert" or "xlm_roberta")
    saved as a sentence-transformers folder at `out`. "embeddinggemma" is EmbeddingGemma's
    whole layout (six layers, the sixth full; Dense modules out to 4x the width and back,
    without bias or activation), which llama.cpp's converter writes as `gemma-embedding`."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import (
        Dense,
        Normalize,
        Pooling,
        Transformer,
    )
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    cfg, model_class = _config(family, len(reference), reference.pad_token_id or 0)
    hf_dir = out.parent / f"{out.name}-hf"
    random_hf(cfg, model_class).save_pretrained(hf_dir)
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_dir / name, hf_dir / name)
    body = Transformer(str(hf_dir))
    if family == "qwen3":
        modules = [body, Pooling(64, "lasttoken"), Normalize()]
    elif family in ("nomic_bert", "xlm_roberta"):
        modules = [body, Pooling(64, "mean"), Normalize()]
    elif family == "embeddinggemma":
        torch.manual_seed(1)
        modules = [body, Pooling(64, "mean"),
                   Dense(64, 256, bias=False, activation_function=torch.nn.Identity()),
                   Dense(256, 64, bias=False, activation_function=torch.nn.Identity()),
                   Normalize()]
    else:
        torch.manual_seed(1)
        modules = [body, Pooling(64, "mean"),
                   Dense(64, 96, bias=False, activation_function=torch.nn.Identity()),
                   Dense(96, 48, bias=True, activation_function=torch.nn.Tanh()), Normalize()]
    SentenceTransformer(modules=modules, device="cpu").save(str(out))
    shutil.rmtree(hf_dir)
    return out
