"""BERT-family sentence encoders (all-MiniLM, bge, e5): bidirectional attention over one
input's own tokens, absolute learned positions, token types, post-norm layers, then the
pooling and normalization the folder's sentence-transformers files name.

The model is a function of explicit inputs (`encode`), like the decoder families; it keeps no
KV: every input is computed whole, in one round, and only its pooled vector leaves.
"""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from engine.execution.model.config import UnsupportedModel
from engine.execution.model.linear_kernels import (
    Weight,
    is_packed,
    onednn_linear,
    pack,
    product_for,
    stacked_rows,
    weight_nbytes,
)
from engine.execution.model.pooling import Pooling, pool_states, pooling_of
from engine.execution.model.pooling import read_json as _json
from engine.kernels import ops
from engine.kernels.quant import QuantWeight, dequantize_rows

HF_MODEL_TYPES = ("bert", "nomic_bert", "roberta", "xlm-roberta")  # nomic_bert: its own file
# RoBERTa and XLM-RoBERTa (e5-multilingual, bge-m3, bge-reranker): BERT's layers, positions
# counted from the padding id + 1, one token type, and a classifier head of its own
ROBERTA_TYPES = ("roberta", "xlm-roberta")
# cross-encoders: a sequence classifier with one label, its relevance score
SCORERS = ("BertForSequenceClassification", "RobertaForSequenceClassification",
           "XLMRobertaForSequenceClassification")
ACTIVATIONS = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh"}
# the longest input whose attention runs in Ferry's kernel (encode_native); from here on
# torch's (its flash kernel) is faster
SHORT_INPUT = 128


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    layer_norm_eps: float
    max_position_embeddings: int
    type_vocab_size: int
    gelu: str  # torch's gelu `approximate`: "none" (erf) or "tanh"
    pooling: Pooling
    normalize: bool
    max_seq_length: int  # inputs longer than this are refused (the model's context)
    # widths the model was trained to be cut to (Matryoshka); () = only its full width
    matryoshka_dims: tuple[int, ...] = ()
    # a cross-encoder (a sequence classifier with one label, SCORERS): scores a query and
    # document pair, [CLS] query [SEP] document [SEP], from the pooled [CLS] state
    scores: bool = False
    # nomic-bert: rotary positions of this base (rotate-half layout) instead of learned
    # ones, and a SwiGLU MLP (down(silu(gate(x)) * up(x))) instead of GELU
    rope_theta: float | None = None
    gated: bool = False
    # RoBERTa and XLM-RoBERTa: a token's learned position is its index plus this (the
    # padding id + 1), and a cross-encoder's head is named classifier.dense/out_proj
    roberta: bool = False
    position_offset: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


def config_from_folder(folder: str | Path) -> BertConfig:
    folder = Path(folder)
    cfg = _json(folder / "config.json")
    if cfg.get("model_type") not in HF_MODEL_TYPES:
        raise UnsupportedModel(f"model_type {cfg.get('model_type')!r} is not a BERT encoder")
    if cfg.get("model_type") == "nomic_bert":
        from engine.execution.model.architectures.encoders import nomic_bert

        return nomic_bert.config_from_hf(cfg, folder)
    if cfg.get("position_embedding_type", "absolute") != "absolute":
        raise UnsupportedModel("only absolute position embeddings are supported")
    act = cfg.get("hidden_act", "gelu")
    if act not in ACTIVATIONS:
        raise UnsupportedModel(f"hidden_act {act!r} is not supported")
    scores = any(a in SCORERS for a in cfg.get("architectures") or [])
    roberta = cfg.get("model_type") in ROBERTA_TYPES
    offset = int(cfg.get("pad_token_id", 1)) + 1 if roberta else 0
    if scores and len(cfg.get("id2label") or {"0": ""}) != 1:
        raise UnsupportedModel("a cross-encoder must have exactly one label (a relevance score)")
    pooling: Pooling = "cls"  # a cross-encoder's head reads [CLS], unnormalized
    normalize = False
    if not scores:
        pooling, normalize = pooling_of(folder)
    positions = int(cfg["max_position_embeddings"])
    st = _json(folder / "sentence_bert_config.json")
    st_config = _json(folder / "config_sentence_transformers.json")
    dims = st_config.get("matryoshka_dims") or cfg.get("matryoshka_dims") or ()
    return BertConfig(
        vocab_size=int(cfg["vocab_size"]), hidden_size=int(cfg["hidden_size"]),
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=int(cfg["num_hidden_layers"]), num_heads=int(cfg["num_attention_heads"]),
        layer_norm_eps=float(cfg.get("layer_norm_eps", 1e-12)),
        max_position_embeddings=positions, type_vocab_size=int(cfg.get("type_vocab_size", 2)),
        gelu=ACTIVATIONS[act], pooling=pooling, normalize=normalize,
        max_seq_length=min(positions - offset, int(st.get("max_seq_length") or positions)),
        matryoshka_dims=tuple(int(d) for d in dims), scores=scores, roberta=roberta,
        position_offset=offset)


# --- weights --------------------------------------------------------------------------------

LAYER_NAMES = {
    "q_w": "attention.self.query.weight", "q_b": "attention.self.query.bias",
    "k_w": "attention.self.key.weight", "k_b": "attention.self.key.bias",
    "v_w": "attention.self.value.weight", "v_b": "attention.self.value.bias",
    "o_w": "attention.output.dense.weight", "o_b": "attention.output.dense.bias",
    "ln1_w": "attention.output.LayerNorm.weight", "ln1_b": "attention.output.LayerNorm.bias",
    "up_w": "intermediate.dense.weight", "up_b": "intermediate.dense.bias",
    "down_w": "output.dense.weight", "down_b": "output.dense.bias",
    "ln2_w": "output.LayerNorm.weight", "ln2_b": "output.LayerNorm.bias",
}


@dataclass(frozen=True)
class BertLayer:
    # the matrices: float tensors, or a quantized GGUF's blocks (engine.kernels.quant)
    qkv_w: Weight  # [3 * hidden, hidden]: one product for q, k and v
    qkv_b: torch.Tensor | None  # biases: None where the family has none (nomic-bert)
    o_w: Weight
    o_b: torch.Tensor | None
    ln1: tuple[torch.Tensor, torch.Tensor]
    up_w: Weight
    up_b: torch.Tensor | None
    down_w: Weight
    down_b: torch.Tensor | None
    ln2: tuple[torch.Tensor, torch.Tensor]
    gate_w: Weight | None = None  # a SwiGLU MLP's gate

    @property
    def tensors(self) -> list[Weight]:
        return [t for t in (self.qkv_w, self.qkv_b, self.o_w, self.o_b, *self.ln1, self.up_w,
                            self.up_b, self.down_w, self.down_b, *self.ln2, self.gate_w)
                if t is not None]

    @property
    def nbytes(self) -> int:
        return sum(weight_nbytes(t) for t in self.tensors)


@dataclass(frozen=True)
class BertWeights:
    word: Weight  # [vocab, hidden]; a GGUF's F16 or quantized table in its blocks
    position: torch.Tensor | None  # None: rotary positions (nomic-bert)
    token_type: torch.Tensor
    ln: tuple[torch.Tensor, torch.Tensor]
    layers: tuple[BertLayer, ...]
    # a cross-encoder's head: the pooler (dense + tanh on [CLS]) and the one-label classifier
    head: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    @property
    def nbytes(self) -> int:
        tensors = [self.word, self.token_type, *self.ln, *(self.head or ())]
        tensors += [self.position] if self.position is not None else []
        return sum(weight_nbytes(t) for t in tensors) + sum(it.nbytes for it in self.layers)


def weights_from_tensors(tensors: Mapping[str, Weight], cfg: BertConfig,
                         dtype: torch.dtype, device: torch.device | str) -> BertWeights:
    """BertModel's tensors (with or without a `bert.` prefix) as BertWeights; a matrix in
    blocks (a quantized GGUF's) is kept as it is."""
    if cfg.rope_theta is not None:
        from engine.execution.model.architectures.encoders import nomic_bert

        return nomic_bert.weights_from_tensors(tensors, cfg, dtype, device)
    flat = {k.removeprefix("bert.").removeprefix("roberta.").removeprefix("model."): v
            for k, v in tensors.items()}

    def get(name: str) -> Any:
        if name not in flat:
            raise UnsupportedModel(f"the checkpoint has no tensor {name!r}")
        return as_weight(flat[name], dtype, device)

    layers = []
    for i in range(cfg.num_layers):
        t = {k: get(f"encoder.layer.{i}.{v}") for k, v in LAYER_NAMES.items()}
        layers.append(BertLayer(
            stacked_rows([t["q_w"], t["k_w"], t["v_w"]]),
            torch.cat([t["q_b"], t["k_b"], t["v_b"]]),
            t["o_w"], t["o_b"], (t["ln1_w"], t["ln1_b"]), t["up_w"], t["up_b"], t["down_w"],
            t["down_b"], (t["ln2_w"], t["ln2_b"])))
    # BERT's pooler then classifier; RoBERTa's classifier head is the same two steps
    dense, out = ("classifier.dense", "classifier.out_proj") if cfg.roberta \
        else ("pooler.dense", "classifier")
    head = (get(f"{dense}.weight"), get(f"{dense}.bias"), get(f"{out}.weight"),
            get(f"{out}.bias")) if cfg.scores else None
    return BertWeights(get("embeddings.word_embeddings.weight"),
                       get("embeddings.position_embeddings.weight"),
                       get("embeddings.token_type_embeddings.weight"),
                       (get("embeddings.LayerNorm.weight"), get("embeddings.LayerNorm.bias")),
                       tuple(layers), head)


def as_weight(value: Weight, dtype: torch.dtype, device: torch.device | str) -> Any:
    """A checkpoint's tensor in `dtype` on `device`; blocks as they are (the loader keeps
    them for the CPU only, where Ferry's kernels multiply them)."""
    if isinstance(value, torch.Tensor):
        return value.to(device=device, dtype=dtype).contiguous()
    if torch.device(device).type != "cpu":
        raise ValueError(f"a matrix in blocks is multiplied on the CPU, not on {device}")
    return value


def load_weights(folder: str | Path, cfg: BertConfig, dtype: torch.dtype,
                 device: torch.device | str) -> BertWeights:
    from safetensors.torch import load_file

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise UnsupportedModel(f"{folder} holds no *.safetensors file")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        tensors.update(load_file(str(file)))
    return weights_from_tensors(tensors, cfg, dtype, device)


def packed(w: BertWeights, bf16: bool = False) -> BertWeights:
    """The layers' matrices in oneDNN's blocked layout (float32 on the CPU; elsewhere as they
    are). MKL's sgemm repacks a weight on every product, which for a short input's few rows
    was most of the forward's time; the packed weights replace the plain ones. `bf16`: packed
    as bf16 where the CPU multiplies bf16 in hardware (linear_kernels.native_bf16_products),
    each product then taking its inputs in bf16; everything between products stays float32."""
    def one(weight: Weight) -> Weight:
        # blocks stay blocks: Ferry's kernels multiply them
        return pack(weight, bf16) if isinstance(weight, torch.Tensor) else weight

    def bias(b: torch.Tensor | None, product: Weight) -> torch.Tensor | None:
        # a bf16 product's bias in bf16 once, not cast on every product
        if b is None or not isinstance(product, torch.Tensor):
            return b
        return b.to(product.dtype)

    def layer(it: BertLayer) -> BertLayer:
        qkv, o, up, down = one(it.qkv_w), one(it.o_w), one(it.up_w), one(it.down_w)
        return dataclasses.replace(
            it, qkv_w=qkv, o_w=o, up_w=up, down_w=down,
            qkv_b=bias(it.qkv_b, qkv), o_b=bias(it.o_b, o), up_b=bias(it.up_b, up),
            down_b=bias(it.down_b, down),
            gate_w=None if it.gate_w is None else one(it.gate_w))
    return dataclasses.replace(w, layers=tuple(layer(it) for it in w.layers))


def linear(x: torch.Tensor, weight: Weight, bias: torch.Tensor | None,
           wide: bool = True) -> torch.Tensor:
    """x [T, in] @ weight.T (+ bias), from a packed weight where loading packed it, from
    blocks in Ferry's kernels (float32 in and out). `wide=False`: a bf16 product's result
    stays bf16 (linear_kernels.onednn_linear)."""
    if isinstance(weight, torch.Tensor):
        return onednn_linear(x, weight, bias, wide) if is_packed(weight) \
            else F.linear(x, weight, bias)
    return product_for(weight)(x.float(), weight, bias)


# --- the model ------------------------------------------------------------------------------

def encode(w: BertWeights, cfg: BertConfig, ids: torch.Tensor, positions: torch.Tensor,
           token_types: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
    """Packed inputs (ids, positions, token types: [T], the inputs one after another with
    `lengths`) -> the last layer's hidden states [T, hidden]. Attention runs over each input's
    own tokens, both ways. On the CPU with Ferry's kernels, `encode_native` runs the layers;
    elsewhere (a GPU, no C compiler) the packed rows of several inputs are laid out as a
    padded [inputs, longest] block for attention only, the rest runs on the packed rows."""
    n, longest, heads, d = len(lengths), max(lengths), cfg.num_heads, cfg.head_dim
    eps = cfg.layer_norm_eps
    x = embedded(w.word, ids) + w.token_type[token_types]
    if w.position is not None:
        x = x + w.position[positions + cfg.position_offset]
    x = F.layer_norm(x, (cfg.hidden_size,), *w.ln, eps)
    rope = None if cfg.rope_theta is None else rotary_tables(positions, d, cfg.rope_theta,
                                                             x.dtype)
    if x.dtype == torch.float32 and ops.usable(x):
        return encode_native(w, cfg, x, rope, lengths)
    slot, keep = padded_layout(lengths, ids.device) if n > 1 else (None, None)
    for layer in w.layers:
        # q, k, v in float32: bf16 attention would round a padded batch's rows otherwise
        # than one input's. The GELU runs on the product's bf16, its output the bf16 the
        # next product takes (oneDNN's fused GELU rounds a row by how many rows there are)
        qkv = linear(x, layer.qkv_w, layer.qkv_b)  # [T, 3 * hidden]
        if rope is not None:
            rotate_qk_(qkv, rope, heads)
        if slot is None:  # one input: its rows are the block
            attn = attend_alone(qkv, heads)
        else:
            padded = qkv.new_zeros(n * longest, 3 * cfg.hidden_size)
            padded[slot] = qkv
            q, k, v = padded.view(n, longest, 3, heads, d).permute(2, 0, 3, 1, 4)
            attn = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)  # [n, heads, L, d]
            attn = attn.transpose(1, 2).reshape(n * longest, cfg.hidden_size)[slot]
        x = F.layer_norm(x + linear(attn, layer.o_w, layer.o_b), (cfg.hidden_size,),
                         *layer.ln1, eps)
        if layer.gate_w is not None:  # SwiGLU
            up = F.silu(linear(x, layer.gate_w, None)) * linear(x, layer.up_w, layer.up_b)
        else:
            up = F.gelu(linear(x, layer.up_w, layer.up_b, wide=False), approximate=cfg.gelu)
        x = F.layer_norm(x + linear(up, layer.down_w, layer.down_b), (cfg.hidden_size,),
                         *layer.ln2, eps)
    return x


def encode_native(w: BertWeights, cfg: BertConfig, x: torch.Tensor,
                  rope: tuple[torch.Tensor, torch.Tensor] | None,
                  lengths: Sequence[int]) -> torch.Tensor:
    """`encode`'s layers on the CPU with the steps between the products in Ferry's kernels:
    each short input's attention over its own rows (no padding to a block), the residual add
    with LayerNorm; a few calls a layer instead of torch's ~15 ops, whose fixed cost is most
    of a short input's time. An input longer than SHORT_INPUT attends in torch's kernel, alone.
    Each step works on an input's own rows whatever it is batched with. Each product takes
    its input in the dtype it multiplies (bf16 for a bf16-packed matrix), as `encode`'s do."""
    heads = cfg.num_heads
    lens = torch.tensor(list(lengths), dtype=torch.int64, device=x.device)
    starts = itertools.accumulate(lengths, initial=0)  # each input's first row
    long = [(s, n) for s, n in zip(starts, lengths) if n > SHORT_INPUT]
    eps = cfg.layer_norm_eps
    xin = x  # x in the dtype the next product takes
    for i, layer in enumerate(w.layers):
        # q and k turned by rope in float32, as `encode` turns them
        qkv = linear(xin, layer.qkv_w, layer.qkv_b, wide=rope is not None)  # [T, 3 * hidden]
        if rope is not None:
            rotate_qk_(qkv, rope, heads)
        attn = ops.encoder_attention(qkv, lens, heads, takes(layer.o_w), SHORT_INPUT)
        for s, n in long:
            attn[s:s + n] = attend_alone(qkv[s:s + n].float(), heads)
        x, x16 = ops.add_layer_norm(x, linear(attn, layer.o_w, layer.o_b, wide=False),
                                    *layer.ln1, eps, takes(layer.up_w) == torch.bfloat16)
        xin = x if x16 is None else x16
        if layer.gate_w is not None:  # SwiGLU
            up = F.silu(linear(x, layer.gate_w, None)) * linear(x, layer.up_w, layer.up_b)
        else:
            up = F.gelu(linear(xin, layer.up_w, layer.up_b, wide=False), approximate=cfg.gelu)
        last = i + 1 == len(w.layers)
        x, x16 = ops.add_layer_norm(
            x, linear(up, layer.down_w, layer.down_b, wide=False), *layer.ln2, eps,
            not last and takes(w.layers[i + 1].qkv_w) == torch.bfloat16)
        xin = x if x16 is None else x16
    return x


def rotate_qk_(qkv: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
               heads: int) -> None:
    """q and k of qkv [T, 3 * hidden] turned in place, by each token's own position."""
    qk = qkv[:, :2 * qkv.shape[1] // 3].view(qkv.shape[0], 2 * heads, -1)
    qk.copy_(rotate(qk, *rope))


def attend_alone(qkv: torch.Tensor, heads: int) -> torch.Tensor:
    """One input's attention over its own rows: qkv [n, 3 * hidden] (q | k | v) -> [n,
    hidden], in torch's kernel."""
    n, hidden = qkv.shape[0], qkv.shape[1] // 3
    q, k, v = qkv.view(1, n, 3, heads, hidden // heads).permute(2, 0, 3, 1, 4)
    return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(n, hidden)


def takes(weight: Weight) -> torch.dtype:
    """The dtype a product with this matrix takes its input in: bf16 for a bf16 (packed)
    matrix, else float32 (float32 matrices, and blocks: Ferry's kernels take float32)."""
    return torch.bfloat16 if isinstance(weight, torch.Tensor) and \
        weight.dtype == torch.bfloat16 else torch.float32


def embedded(table: Weight, ids: torch.Tensor) -> torch.Tensor:
    """The table's rows of `ids` [T] as float32 [T, hidden] (a table in blocks decodes those
    rows only)."""
    if isinstance(table, torch.Tensor):
        return table[ids]
    if not isinstance(table, QuantWeight):
        raise TypeError(f"an embedding table cannot be a {type(table).__name__}")
    return dequantize_rows(table, ids)


def padded_layout(lengths: Sequence[int], device: torch.device
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(slot [T]: each packed row's place in the padded [inputs * longest] block, keep
    [inputs, 1, 1, longest]: which keys are an input's own) for inputs of `lengths`."""
    n, longest = len(lengths), max(lengths)
    lens = torch.tensor(list(lengths), dtype=torch.int64, device=device)
    starts = torch.cumsum(lens, 0) - lens
    row_in = torch.repeat_interleave(torch.arange(n, device=device), lens)
    col = torch.arange(int(sum(lengths)), device=device) - starts[row_in]
    keep = (torch.arange(longest, device=device)[None, :] < lens[:, None])[:, None, None, :]
    return row_in * longest + col, keep


def rotary_tables(positions: torch.Tensor, dim: int, theta: float,
                  dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [T, 1, dim] of the positions, in the rotate-half layout."""
    inv = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float32,
                                       device=positions.device) / dim)
    freqs = positions.float()[:, None] * inv[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)[:, None, :]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, dim] turned by (cos, sin): x * cos + rotate_half(x) * sin."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def pool(hidden: torch.Tensor, cfg: BertConfig, lengths: Sequence[int]) -> torch.Tensor:
    """[T, hidden] packed states -> [inputs, hidden] float32 sentence vectors (pooled as the
    config says, then unit length where the model normalizes)."""
    out = pool_states(hidden, cfg.pooling, lengths)
    return F.normalize(out, p=2, dim=1) if cfg.normalize else out


def score(hidden: torch.Tensor, w: BertWeights, lengths: Sequence[int]) -> torch.Tensor:
    """A cross-encoder's relevance per input [inputs]: sigmoid of the classifier's one logit
    over the pooled [CLS] state (what sentence-transformers' CrossEncoder answers)."""
    assert w.head is not None, "not a cross-encoder"
    dense_w, dense_b, cls_w, cls_b = w.head
    lens = torch.tensor(list(lengths), dtype=torch.int64, device=hidden.device)
    first = torch.cumsum(lens, 0) - lens
    pooled = torch.tanh(F.linear(hidden[first], dense_w, dense_b))
    return torch.sigmoid(F.linear(pooled, cls_w, cls_b).float()[:, 0])


def token_types(ids: Sequence[int], sep: int) -> list[int]:
    """A pair's token types: 0 through the first [SEP] (the query), 1 after (the document)."""
    cut = next((i + 1 for i, t in enumerate(ids) if t == sep), len(ids))
    return [0] * cut + [1] * (len(ids) - cut)
