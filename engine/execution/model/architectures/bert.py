"""BERT-family sentence encoders (all-MiniLM, bge, e5): bidirectional attention over one
input's own tokens, absolute learned positions, token types, post-norm layers, then the
pooling and normalization the folder's sentence-transformers files name.

The model is a function of explicit inputs (`encode`), like the decoder families; it keeps no
KV: every input is computed whole, in one round, and only its pooled vector leaves.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F

from engine.execution.model.config import UnsupportedModel

Pooling = Literal["mean", "cls", "lasttoken"]
HF_MODEL_TYPES = ("bert",)
ACTIVATIONS = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh"}


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
    # a cross-encoder (BertForSequenceClassification with one label): scores a query and
    # document pair, [CLS] query [SEP] document [SEP], from the pooled [CLS] state
    scores: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


def _json(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text())) if path.is_file() else {}


def _pooling(folder: Path) -> tuple[Pooling, bool]:
    """(pooling, normalize) from modules.json and its Pooling module's config; a folder
    without sentence-transformers files pools by mean and normalizes (their common default)."""
    modules = json.loads((folder / "modules.json").read_text()) \
        if (folder / "modules.json").is_file() else []
    normalize = not modules or any(m.get("type", "").endswith(".Normalize") for m in modules)
    pool_dir = next((m.get("path", "") for m in modules
                     if m.get("type", "").endswith(".Pooling")), "1_Pooling")
    pool = _json(folder / pool_dir / "config.json")
    if pool.get("pooling_mode_cls_token"):
        return "cls", normalize
    if pool.get("pooling_mode_lasttoken"):
        return "lasttoken", normalize
    others = [k for k in ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                          "pooling_mode_weightedmean_tokens") if pool.get(k)]
    if others:
        raise UnsupportedModel(f"pooling {', '.join(others)} is not supported")
    return "mean", normalize


def config_from_folder(folder: str | Path) -> BertConfig:
    folder = Path(folder)
    cfg = _json(folder / "config.json")
    if cfg.get("model_type") not in HF_MODEL_TYPES:
        raise UnsupportedModel(f"model_type {cfg.get('model_type')!r} is not a BERT encoder")
    if cfg.get("position_embedding_type", "absolute") != "absolute":
        raise UnsupportedModel("only absolute position embeddings are supported")
    act = cfg.get("hidden_act", "gelu")
    if act not in ACTIVATIONS:
        raise UnsupportedModel(f"hidden_act {act!r} is not supported")
    scores = "BertForSequenceClassification" in (cfg.get("architectures") or [])
    if scores and len(cfg.get("id2label") or {"0": ""}) != 1:
        raise UnsupportedModel("a cross-encoder must have exactly one label (a relevance score)")
    pooling: Pooling = "cls"  # a cross-encoder's head reads [CLS], unnormalized
    normalize = False
    if not scores:
        pooling, normalize = _pooling(folder)
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
        max_seq_length=min(positions, int(st.get("max_seq_length") or positions)),
        matryoshka_dims=tuple(int(d) for d in dims), scores=scores)


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
    qkv_w: torch.Tensor  # [3 * hidden, hidden]: one product for q, k and v
    qkv_b: torch.Tensor
    o_w: torch.Tensor
    o_b: torch.Tensor
    ln1: tuple[torch.Tensor, torch.Tensor]
    up_w: torch.Tensor
    up_b: torch.Tensor
    down_w: torch.Tensor
    down_b: torch.Tensor
    ln2: tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class BertWeights:
    word: torch.Tensor
    position: torch.Tensor
    token_type: torch.Tensor
    ln: tuple[torch.Tensor, torch.Tensor]
    layers: tuple[BertLayer, ...]
    # a cross-encoder's head: the pooler (dense + tanh on [CLS]) and the one-label classifier
    head: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    @property
    def nbytes(self) -> int:
        tensors = [self.word, self.position, self.token_type, *self.ln, *(self.head or ())]
        for layer in self.layers:
            tensors += [layer.qkv_w, layer.qkv_b, layer.o_w, layer.o_b, *layer.ln1, layer.up_w,
                        layer.up_b, layer.down_w, layer.down_b, *layer.ln2]
        return sum(t.numel() * t.element_size() for t in tensors)


def weights_from_tensors(tensors: Mapping[str, torch.Tensor], cfg: BertConfig,
                         dtype: torch.dtype, device: torch.device | str) -> BertWeights:
    """BertModel's tensors (with or without a `bert.` prefix) as BertWeights."""
    flat = {k.removeprefix("bert.").removeprefix("model."): v for k, v in tensors.items()}

    def get(name: str) -> torch.Tensor:
        if name not in flat:
            raise UnsupportedModel(f"the checkpoint has no tensor {name!r}")
        return flat[name].to(device=device, dtype=dtype).contiguous()

    layers = []
    for i in range(cfg.num_layers):
        t = {k: get(f"encoder.layer.{i}.{v}") for k, v in LAYER_NAMES.items()}
        layers.append(BertLayer(
            torch.cat([t["q_w"], t["k_w"], t["v_w"]]), torch.cat([t["q_b"], t["k_b"], t["v_b"]]),
            t["o_w"], t["o_b"], (t["ln1_w"], t["ln1_b"]), t["up_w"], t["up_b"], t["down_w"],
            t["down_b"], (t["ln2_w"], t["ln2_b"])))
    head = (get("pooler.dense.weight"), get("pooler.dense.bias"), get("classifier.weight"),
            get("classifier.bias")) if cfg.scores else None
    return BertWeights(get("embeddings.word_embeddings.weight"),
                       get("embeddings.position_embeddings.weight"),
                       get("embeddings.token_type_embeddings.weight"),
                       (get("embeddings.LayerNorm.weight"), get("embeddings.LayerNorm.bias")),
                       tuple(layers), head)


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


# --- the model ------------------------------------------------------------------------------

def encode(w: BertWeights, cfg: BertConfig, ids: torch.Tensor, positions: torch.Tensor,
           token_types: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
    """Packed inputs (ids, positions, token types: [T], the inputs one after another with
    `lengths`) -> the last layer's hidden states [T, hidden]. Attention runs over each input's
    own tokens, both ways: the packed rows are laid out as a padded [inputs, longest] block
    for attention only, the rest runs on the packed rows."""
    dev = ids.device
    n, longest, heads, d = len(lengths), max(lengths), cfg.num_heads, cfg.head_dim
    lens = torch.tensor(list(lengths), dtype=torch.int64, device=dev)
    starts = torch.cumsum(lens, 0) - lens
    # packed row -> its place in the padded block; keys past an input's length are masked
    row_in = torch.repeat_interleave(torch.arange(n, device=dev), lens)
    col = torch.arange(ids.numel(), device=dev) - starts[row_in]
    slot = row_in * longest + col
    keep = (torch.arange(longest, device=dev)[None, :] < lens[:, None])[:, None, None, :]
    eps = cfg.layer_norm_eps
    x = w.word[ids] + w.position[positions] + w.token_type[token_types]
    x = F.layer_norm(x, (cfg.hidden_size,), *w.ln, eps)
    for layer in w.layers:
        qkv = F.linear(x, layer.qkv_w, layer.qkv_b)  # [T, 3 * hidden]
        padded = qkv.new_zeros(n * longest, 3 * cfg.hidden_size)
        padded[slot] = qkv
        q, k, v = padded.view(n, longest, 3, heads, d).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)  # [n, heads, L, d]
        attn = attn.transpose(1, 2).reshape(n * longest, cfg.hidden_size)[slot]
        x = F.layer_norm(x + F.linear(attn, layer.o_w, layer.o_b), (cfg.hidden_size,),
                         *layer.ln1, eps)
        up = F.gelu(F.linear(x, layer.up_w, layer.up_b), approximate=cfg.gelu)
        x = F.layer_norm(x + F.linear(up, layer.down_w, layer.down_b), (cfg.hidden_size,),
                         *layer.ln2, eps)
    return x


def pool(hidden: torch.Tensor, cfg: BertConfig, lengths: Sequence[int]) -> torch.Tensor:
    """[T, hidden] packed states -> [inputs, hidden] float32 sentence vectors (pooled as the
    config says, then unit length where the model normalizes)."""
    dev = hidden.device
    lens = torch.tensor(list(lengths), dtype=torch.int64, device=dev)
    starts = torch.cumsum(lens, 0) - lens
    h = hidden.float()
    if cfg.pooling == "cls":
        out = h[starts]
    elif cfg.pooling == "lasttoken":
        out = h[starts + lens - 1]
    else:
        row_in = torch.repeat_interleave(torch.arange(len(lengths), device=dev), lens)
        sums = torch.zeros(len(lengths), h.shape[1], dtype=h.dtype, device=dev)
        sums.index_add_(0, row_in, h)
        out = sums / lens[:, None].to(h.dtype)
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
