"""A llama.cpp `bert` (or `nomic-bert`) GGUF written from a sentence-transformers folder with
gguf-py's writer, under llama.cpp's tensor names and metadata keys (what its converter writes
for all-MiniLM or bge: q/k/v apart, no pooler, the WordPiece vocabulary in "phantom space"
form, the pooling of the folder's Pooling module; for nomic-bert the fused qkv and the rope
base). An XLM-RoBERTa folder (multilingual-e5, or a bge-reranker-like sequence classifier
saved by transformers) as the converter writes it: its Unigram pieces with their scores
(tokenizer model "t5"), the position table cut to start at the first token's, one token
type, a classifier's head as `cls` and `cls.output`. Matrices in F16 like the converter's
default, or in the block types `types` names per tensor kind (`{"attn_v": "Q4_0", ...}`,
quantized by gguf-py, as llama-quantize writes them); vectors, the position and token-type
tables in F32, as it keeps them."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

PHANTOM = "\u2581"


def write_bert_gguf(folder: Path, out: Path, types: dict[str, str] | None = None) -> Path:
    import gguf
    from safetensors.numpy import load_file

    cfg = json.loads((folder / "config.json").read_text())
    tok = json.loads((folder / "tokenizer.json").read_text())
    tok_cfg = json.loads((folder / "tokenizer_config.json").read_text())
    pooling_file = folder / "1_Pooling" / "config.json"
    pooling = json.loads(pooling_file.read_text()) if pooling_file.is_file() else None
    nomic = cfg["model_type"] == "nomic_bert"
    # XLM-RoBERTa: positions from the padding id + 1, which the converter cuts away
    offset = cfg["pad_token_id"] + 1 if cfg["model_type"] == "xlm-roberta" else 0
    arch = gguf.MODEL_ARCH.NOMIC_BERT if nomic else gguf.MODEL_ARCH.BERT
    w = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[arch])
    w.add_name(folder.name)
    w.add_context_length(cfg["max_position_embeddings"] - offset)
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_layer_norm_eps(cfg["layer_norm_eps"])
    w.add_causal_attention(False)
    if pooling is not None:  # a classifier's folder has none, and its file names none
        cls = pooling.get("pooling_mode_cls_token") or pooling.get("pooling_mode") == "cls"
        w.add_pooling_type(gguf.PoolingType.CLS if cls else gguf.PoolingType.MEAN)
    if nomic:
        w.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    special = {t["content"] for t in tok["added_tokens"] if t.get("special")}
    w.add_token_type_count(cfg.get("type_vocab_size", 2))
    if tok["model"]["type"] == "Unigram":
        vocab = _unigram_vocab(w, tok, special)
    else:
        vocab = _wordpiece_vocab(w, tok, special, bool(tok_cfg.get("do_lower_case", True)))
    # as gguf-py's SpecialVocab writes them: [CLS] (<s>) as BOS, [SEP] (</s>) as EOS and
    # separator
    for name, add in (("cls_token", w.add_bos_token_id), ("sep_token", w.add_eos_token_id),
                      ("sep_token", w.add_sep_token_id), ("unk_token", w.add_unk_token_id),
                      ("pad_token", w.add_pad_token_id), ("mask_token", w.add_mask_token_id)):
        add(vocab[tok_cfg[name]])

    names = gguf.get_tensor_name_map(arch, cfg["num_hidden_layers"])
    tensors = load_file(str(folder / "model.safetensors"))
    for key, value in tensors.items():
        key = key.removeprefix("bert.").removeprefix("roberta.")
        if key.startswith("pooler.") or key == "embeddings.position_ids":
            continue  # the converter drops them
        if key == "embeddings.position_embeddings.weight":
            value = value[offset:]
        name = names.get_name(key, try_suffixes=(".weight", ".bias"))
        assert name is not None, key
        # as the converter: position and token-type tables stay F32 (llama.cpp adds them)
        wide = value.ndim < 2 or name.startswith(("position_embd", "token_types"))
        kind = name.split(".")[-2] if name.startswith("blk.") else name.rsplit(".", 1)[0]
        qtype = (types or {}).get(kind) if name.endswith(".weight") and not wide else None
        if qtype is None:
            w.add_tensor(name, value.astype(np.float32 if wide else np.float16))
        else:
            kind_id = gguf.GGMLQuantizationType[qtype]
            blocks = gguf.quants.quantize(value.astype(np.float32), kind_id)
            w.add_tensor(name, blocks, raw_dtype=kind_id)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def _wordpiece_vocab(w: Any, tok: dict[str, Any], special: set[str], lowercase: bool
                     ) -> dict[str, int]:
    import gguf

    vocab: dict[str, int] = tok["model"]["vocab"]  # WordPiece: piece -> id
    pieces = sorted(vocab, key=vocab.__getitem__)
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("bert-bge")
    w.add_token_list([p if p in special else p[2:] if p.startswith("##") else PHANTOM + p
                      for p in pieces])
    w.add_token_types([gguf.TokenType.CONTROL if p in special else gguf.TokenType.NORMAL
                       for p in pieces])
    w.add_bool("tokenizer.ggml.normalizer.lowercase", lowercase)
    return vocab


def _unigram_vocab(w: Any, tok: dict[str, Any], special: set[str]) -> dict[str, int]:
    """XLM-RoBERTa's pieces as the converter reads them from tokenizer.json: scores kept,
    <unk> typed unknown, the special tokens control, the character map copied."""
    import base64

    import gguf

    pieces = [(str(p), float(score)) for p, score in tok["model"]["vocab"]]
    unk = int(tok["model"]["unk_id"])
    w.add_tokenizer_model("t5")
    w.add_tokenizer_pre("default")
    w.add_token_list([p for p, _ in pieces])
    w.add_token_scores([score for _, score in pieces])
    w.add_token_types([gguf.TokenType.UNKNOWN if i == unk else gguf.TokenType.CONTROL
                       if p in special else gguf.TokenType.NORMAL
                       for i, (p, _) in enumerate(pieces)])
    w.add_add_space_prefix(True)
    w.add_remove_extra_whitespaces(True)
    normalizer = tok.get("normalizer") or {}
    if normalizer.get("type") == "Precompiled":
        w.add_precompiled_charsmap(base64.b64decode(normalizer["precompiled_charsmap"]))
    return {p: i for i, (p, _) in enumerate(pieces)}
