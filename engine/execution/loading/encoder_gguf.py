"""llama.cpp's `bert` and `nomic-bert` GGUF files as a BERT encoder: the metadata as a
BertConfig (nomic-bert: rotary positions of `rope.freq_base`, a SwiGLU MLP), the tensors under
BertModel's or NomicBertModel's names (then bert.weights_from_tensors, as for a safetensors
folder). A `bert` file with a SentencePiece vocabulary is an XLM-RoBERTa model (multilingual-e5,
bge-m3); with rank pooling and its `cls` head, a cross-encoder (bge-reranker).

llama.cpp's converter writes q, k and v apart (a fused `attn_qkv` is cut back into them),
drops the pooler, and keeps the pooling the folder's sentence-transformers files name in
`bert.pooling_type`. A GGUF says nothing of normalization: vectors come out unit length, as
llama.cpp's server answers them. A quantized file's layer matrices (Q8_0, Q4_K...) stay in
their blocks on the CPU and multiply in Ferry's kernels with int8 activations, as llama.cpp's
do: the model costs its file's bytes and multiplies at int8 speed. Its other tensors, and
every tensor elsewhere or under `--dtype float32`, are dequantized on load (gguf-py's exact
dequantization).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.execution.errors import ModelFileError
from engine.execution.model.architectures.encoders import bert
from engine.execution.model.linear_kernels import Weight
from engine.execution.model.pooling import Pooling
from engine.kernels import quant
from engine.kernels.quant import QuantWeight

ARCHS = ("bert", "nomic-bert")
# decoder architectures whose GGUF is an embedding model where it names a pooling
# (llama.cpp's converter writes `{arch}.pooling_type` from a sentence-transformers folder's
# Pooling module: Qwen3-Embedding's last token), and llama.cpp's EmbeddingGemma, which is
# one always (mean pooling where the file names none)
DECODER_ARCHS = ("qwen3", "gemma-embedding")
EMBEDDING_ONLY_ARCHS = {"gemma-embedding": 1}
# bert.pooling_type (llama.cpp's enum): none, mean, cls, last, rank
POOLING: dict[int, Pooling] = {1: "mean", 2: "cls", 3: "lasttoken"}
# a reranker's (Qwen3-Reranker's `cls.output` rows score the last token, a cross-encoder's
# `cls` head the first); the converter writes no pooling for a cross-encoder's folder
# without a Pooling module, so its `cls` tensors say it too
RANK = 4
TOP = {
    "token_embd": "embeddings.word_embeddings",
    "position_embd": "embeddings.position_embeddings",
    "token_types": "embeddings.token_type_embeddings",
    "token_embd_norm": "embeddings.LayerNorm",
    # an XLM-RoBERTa cross-encoder's classifier head (bge-reranker)
    "cls": "classifier.dense", "cls.output": "classifier.out_proj",
}
HEAD = ("cls.weight", "cls.bias", "cls.output.weight", "cls.output.bias")
LAYER = {
    "attn_q": "attention.self.query", "attn_k": "attention.self.key",
    "attn_v": "attention.self.value", "attn_output": "attention.output.dense",
    "attn_output_norm": "attention.output.LayerNorm", "ffn_up": "intermediate.dense",
    "ffn_down": "output.dense", "layer_output_norm": "output.LayerNorm",
}
# nomic-bert: transformers' NomicBertModel names (architectures/encoders/nomic_bert.py)
NOMIC_TOP = {**TOP, "position_embd": ""}
NOMIC_LAYER = {
    "attn_qkv": "self_attn.qkv", "attn_output": "self_attn.o_proj",
    "attn_output_norm": "post_attention_layernorm", "ffn_up": "mlp.up_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_down": "mlp.down_proj",
    "layer_output_norm": "post_mlp_layernorm",
}
# a layer's matrices: kept in their blocks where quantized (tensors_from_gguf)
MATRICES = ("attn_q", "attn_k", "attn_v", "attn_qkv", "attn_output", "ffn_up", "ffn_gate",
            "ffn_down")


def _reader(path: Path) -> Any:
    import gguf

    try:
        return gguf.GGUFReader(str(path), "r")
    except (ValueError, IndexError, OSError, KeyError) as exc:
        raise ModelFileError(f"{path}: not a readable GGUF file ({exc})") from exc


def _scalar(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def gguf_architecture(path: str | Path) -> str | None:
    """`general.architecture` of a GGUF file, from its metadata alone."""
    from engine.execution.loading.gguf_file import gguf_metadata_value

    value = gguf_metadata_value(path, "general.architecture")
    return None if value is None else str(value)


def is_encoder_gguf(path: str | Path) -> bool:
    """A GGUF file of an embedding model (or reranker): an encoder architecture's, or a
    decoder's that names its pooling (decoder_pooling_type)."""
    from engine.execution.loading.model_files import is_gguf

    try:
        return is_gguf(path) and (gguf_architecture(path) in ARCHS
                                  or decoder_pooling_type(path) is not None)
    except ModelFileError:
        return False


def is_cross_encoder_gguf(path: str | Path) -> bool:
    """An encoder GGUF of a cross-encoder (rank pooling, or its classifier's `cls` tensors)."""
    return gguf_architecture(path) in ARCHS and _scores(_reader(Path(path)))


def _scores(reader: Any) -> bool:
    arch = _scalar(reader, "general.architecture")
    return _scalar(reader, f"{arch}.pooling_type") == RANK \
        or any(t.name.startswith("cls") for t in reader.tensors)


def decoder_pooling_type(path: str | Path) -> int | None:
    """llama.cpp's pooling type of a decoder GGUF that has one (Qwen3-Embedding's 3, the last
    token; Qwen3-Reranker's 4, rank; EmbeddingGemma's 1, mean), None for a decoder file that
    is a chat model."""
    from engine.execution.loading.gguf_file import gguf_metadata_value

    arch = gguf_architecture(path)
    if arch not in DECODER_ARCHS:
        return None
    kind = gguf_metadata_value(path, f"{arch}.pooling_type")
    return int(kind) if isinstance(kind, int) and kind > 0 else EMBEDDING_ONLY_ARCHS.get(arch)


def config_from_gguf(path: Path, reader: Any) -> bert.BertConfig:
    arch = str(_scalar(reader, "general.architecture"))
    if arch not in ARCHS:
        raise ModelFileError(f"{path}: architecture {arch!r} is not a BERT encoder")

    def need(key: str) -> Any:
        value = _scalar(reader, f"{arch}.{key}")
        if value is None:
            raise ModelFileError(f"{path}: the metadata has no {arch}.{key}")
        return value

    pooling_type = int(_scalar(reader, f"{arch}.pooling_type") or 1)  # unset: llama.cpp's mean
    # XLM-RoBERTa's SentencePiece vocabulary: its classifier head is RoBERTa's, and the
    # converter has cut the position table to start at the first token's
    roberta = _scalar(reader, "tokenizer.ggml.model") == "t5"
    scores = _scores(reader)
    if scores and not (roberta and {t.name for t in reader.tensors} >= set(HEAD)):
        raise ModelFileError(
            f"{path}: a BERT cross-encoder's GGUF cannot score as its model does (llama.cpp's "
            "converter drops the pooler its classifier reads); serve its safetensors folder")
    if not scores and pooling_type not in POOLING:
        raise ModelFileError(f"{path}: pooling type {pooling_type} is not supported "
                             "(mean, cls, last or rank)")
    context = int(need("context_length"))
    nomic = arch == "nomic-bert"
    return bert.BertConfig(
        vocab_size=_vocab(path, reader),
        hidden_size=int(need("embedding_length")),
        intermediate_size=int(need("feed_forward_length")),
        num_layers=int(need("block_count")), num_heads=int(need("attention.head_count")),
        layer_norm_eps=float(_scalar(reader, f"{arch}.attention.layer_norm_epsilon") or 1e-12),
        max_position_embeddings=context,
        type_vocab_size=int(_scalar(reader, "tokenizer.ggml.token_type_count") or 2),
        gelu="none", pooling="cls" if scores else POOLING[pooling_type],
        normalize=not scores, max_seq_length=context, scores=scores, roberta=roberta,
        rope_theta=float(_scalar(reader, f"{arch}.rope.freq_base") or 1000.0) if nomic
        else None, gated=nomic)


def _vocab(path: Path, reader: Any) -> int:
    embd = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embd is None:
        raise ModelFileError(f"{path}: tensor token_embd.weight is missing")
    return int(embd.shape[-1])


def _hf_name(name: str, nomic: bool) -> str | None:
    base, _, kind = name.rpartition(".")
    top, layer, prefix = (NOMIC_TOP, NOMIC_LAYER, "layers") if nomic \
        else (TOP, LAYER, "encoder.layer")
    if kind not in ("weight", "bias"):
        return None
    if top.get(base):
        return f"{top[base]}.{kind}"
    parts = base.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in layer:
        return f"{prefix}.{parts[1]}.{layer[parts[2]]}.{kind}"
    if len(parts) == 3 and parts[0] == "blk" and parts[2] == "attn_qkv":
        return f"{prefix}.{parts[1]}.qkv.{kind}"
    return None


def tensors_from_gguf(path: Path, reader: Any, nomic: bool = False, blocks: bool = False
                      ) -> dict[str, Weight]:
    """Every tensor under BertModel's name (a fused qkv cut into q, k, v), or
    NomicBertModel's (its qkv kept fused): as float32, or with `blocks` a layer's matrix in a
    block type Ferry's kernels multiply as those blocks (a QuantWeight)."""
    from gguf.quants import dequantize

    out: dict[str, Weight] = {}
    for t in reader.tensors:
        key = _hf_name(t.name, nomic)
        if key is None:
            raise ModelFileError(f"{path}: tensor {t.name} is not one Ferry knows for "
                                 f"{'nomic-bert' if nomic else 'bert'}")
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        value: Weight
        if blocks and _kept_in_blocks(t):
            raw = np.ascontiguousarray(t.data).view(np.uint8)  # F16's halves as bytes
            data = torch.from_numpy(raw.reshape(shape[0], -1).copy())
            value = QuantWeight(int(t.tensor_type), data, shape[1], shape[0])
        else:
            try:
                floats = dequantize(np.asarray(t.data), t.tensor_type)
            except NotImplementedError as exc:
                raise ModelFileError(f"{path}: tensor {t.name}: {exc}") from exc
            value = torch.from_numpy(np.array(floats, dtype=np.float32)).reshape(shape)
        if ".qkv." in key and not nomic:
            for i, part in enumerate(("query", "key", "value")):
                out[key.replace(".qkv.", f".attention.self.{part}.")] = _rows(value, i, 3)
        else:
            out[key] = value
    return out


def _kept_in_blocks(t: Any) -> bool:
    """Kept as the file stores it: a layer's matrix in a block type (not F32, F16 or BF16)
    that Ferry's kernels multiply (its products then take int8 activations, as llama.cpp's),
    and the token table in any type but F32 (each input decodes its own rows)."""
    part = t.name.split(".")
    qtype = int(t.tensor_type)
    if not quant.supported(qtype) or qtype == quant.F32:
        return False
    if t.name == "token_embd.weight":
        return True
    return (len(part) == 4 and part[0] == "blk" and part[2] in MATRICES
            and part[3] == "weight" and qtype not in (quant.F16, quant.BF16))


def _rows(value: Weight, i: int, n: int) -> Weight:
    """The i-th of n equal row slices of a matrix (q, k or v of a fused qkv)."""
    if isinstance(value, torch.Tensor):
        return value.chunk(n, dim=0)[i]
    if not isinstance(value, QuantWeight):
        raise TypeError(f"cannot cut {type(value).__name__} by rows")
    rows = value.out_features // n
    return QuantWeight(value.qtype, value.data[i * rows:(i + 1) * rows].contiguous(),
                       value.in_features, rows)


def _shape(value: Weight) -> tuple[int, ...]:
    if isinstance(value, torch.Tensor):
        return tuple(value.shape)
    return (value.out_features, value.in_features)


def load_bert_gguf(path: str | Path, dtype: torch.dtype, device: torch.device | str,
                   blocks: bool = False) -> tuple[bert.BertConfig, bert.BertWeights]:
    """A `bert` GGUF's config and weights (ModelFileError naming the file when it is not one
    Ferry runs; UnsupportedModel, from the weights, naming a missing tensor). `blocks`: the
    layers' quantized matrices kept as the file's blocks (on the CPU only), else dequantized."""
    path = Path(path)
    reader = _reader(path)
    cfg = config_from_gguf(path, reader)
    tensors = tensors_from_gguf(path, reader, cfg.rope_theta is not None,
                                blocks and torch.device(device).type == "cpu")
    for name, t in tensors.items():
        want = _expected_shape(name, cfg)
        if want is not None and _shape(t) != want:
            raise ModelFileError(f"{path}: tensor {name} has shape {list(_shape(t))}, but the "
                                 f"metadata implies {list(want)}")
    return cfg, bert.weights_from_tensors(tensors, cfg, dtype, device)


def _expected_shape(name: str, cfg: bert.BertConfig) -> tuple[int, ...] | None:
    h, ff = cfg.hidden_size, cfg.intermediate_size
    if name == "embeddings.word_embeddings.weight":
        return (cfg.vocab_size, h)
    if name == "embeddings.position_embeddings.weight":
        return (cfg.max_position_embeddings, h)
    if name == "embeddings.token_type_embeddings.weight":
        return (cfg.type_vocab_size, h)
    if name.endswith(("intermediate.dense.weight", "mlp.up_proj.weight",
                      "mlp.gate_proj.weight")):
        return (ff, h)
    if name.endswith(("output.dense.weight", "mlp.down_proj.weight")) \
            and ".attention." not in name:
        return (h, ff)
    if name.endswith(".self_attn.qkv.weight"):
        return (3 * h, h)
    if name.endswith((".self.query.weight", ".self.key.weight", ".self.value.weight",
                      "attention.output.dense.weight", "self_attn.o_proj.weight")):
        return (h, h)
    return None
