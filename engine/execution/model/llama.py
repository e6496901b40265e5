"""Llama-family decoder over packed ragged tokens: Llama 2/3, Mistral, Qwen2/2.5, Qwen3, SmolLM2.

The forward pass is a function of explicit inputs: token ids [T], positions [T], an attention
backend already prepared for the round (it holds the KV pool and the round's index tensors),
and the rows whose logits are wanted. No padding, no hidden cache state in the modules.
Parameter names follow the Hugging Face checkpoint keys, except the fused projections
(`qkv_proj`, `gate_up_proj`) whose pieces are mapped by `packed_modules`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from engine.execution.attention.base import AttentionBackend
from engine.execution.model import linear_kernels
from engine.execution.model.fused_decode import FusedDecode
from engine.execution.model.layers import (
    ROPE_TYPES,
    Embedding,
    Linear,
    PackedLinear,
    RMSNorm,
    RotaryEmbedding,
    rotate_,
    silu_and_mul,
)

SUPPORTED = ("llama", "mistral", "qwen2", "qwen3")


def type_name(qtype: int) -> str:
    from engine.kernels import quant

    return quant.type_name(qtype)


class UnsupportedModel(ValueError):
    """The checkpoint's architecture or settings are outside the Llama family we implement."""


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope_theta: float
    rope: dict[str, Any] = field(default_factory=dict)
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    sliding_window: int | None = None  # only when some layer really slides

    @property
    def max_context(self) -> int:
        """Longest sequence we compute exactly: full attention equals a window this long."""
        if self.sliding_window:
            return min(self.max_position_embeddings, self.sliding_window)
        return self.max_position_embeddings

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> ModelConfig:
        """Read a Hugging Face config.json dict (transformers 4 or 5 layout)."""
        kind = cfg.get("model_type")
        if kind not in SUPPORTED:
            raise UnsupportedModel(f"model_type {kind!r} is not supported "
                                   f"(supported: {', '.join(SUPPORTED)})")
        if cfg.get("hidden_act", "silu") != "silu":
            raise UnsupportedModel(f"hidden_act {cfg.get('hidden_act')!r} is not supported")
        heads = cfg["num_attention_heads"]
        # transformers 5 keeps rope_theta inside rope_parameters; 4 had rope_theta + rope_scaling
        rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        if any(isinstance(v, dict) for v in rope.values()):
            raise UnsupportedModel("per-layer-type rope parameters are not supported")
        theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
        rope.setdefault("rope_type", rope.get("type", "default"))
        if rope["rope_type"] not in ROPE_TYPES:
            raise UnsupportedModel(f"rope_type {rope['rope_type']!r} is not supported "
                                   f"(supported: {', '.join(ROPE_TYPES)})")
        if rope["rope_type"] == "llama3":
            rope.setdefault("original_max_position_embeddings", cfg["max_position_embeddings"])
        window = cfg.get("sliding_window")
        if kind in ("qwen2", "qwen3") and (not cfg.get("use_sliding_window") or (
                "sliding_attention" not in (cfg.get("layer_types") or ["sliding_attention"]))):
            window = None
        return cls(
            model_type=kind,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            rope_theta=float(theta),
            rope=rope,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=kind == "qwen2" or bool(cfg.get("attention_bias", False)),
            o_bias=kind != "qwen2" and bool(cfg.get("attention_bias", False)),
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            qk_norm=kind == "qwen3",
            sliding_window=window,
        )


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, dtype: torch.dtype,
                 device: torch.device | str | None) -> None:
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads = cfg.num_heads, cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = PackedLinear(cfg.hidden_size, (q, kv, kv), ("q", "k", "v"),
                                     cfg.qkv_bias, dtype, device)
        self.o_proj = Linear(q, cfg.hidden_size, cfg.o_bias, dtype, device)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, dtype, device)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, dtype, device)
        self.qk_norm = cfg.qk_norm

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attn: AttentionBackend) -> torch.Tensor:
        t, h, kvh, d = x.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self.qkv_proj(x)
        # rotary results go back into qkv, so that K and V stay adjacent per token: the pool
        # then stores both with one scatter from the view `kv`
        qk = qkv[:, :(h + kvh) * d].view(t, h + kvh, d)
        if self.qk_norm:  # Qwen3: per-head RMSNorm before rotary
            q, k = qk[:, :h], qk[:, h:]
            q.copy_(self.q_norm(q))
            k.copy_(self.k_norm(k))
        rotate_(qk, cos, sin)  # q and k together: one call for both
        q = qkv[:, :h * d].view(t, h, d)
        kv = qkv[:, h * d:].view(t, 2, kvh, d)
        out: torch.Tensor = self.o_proj(attn.forward(q, kv, self.layer))
        return out


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype,
                 device: torch.device | str | None) -> None:
        super().__init__()
        n = cfg.intermediate_size
        self.gate_up_proj = PackedLinear(cfg.hidden_size, (n, n), ("gate", "up"),
                                         cfg.mlp_bias, dtype, device)
        self.down_proj = Linear(n, cfg.hidden_size, cfg.mlp_bias, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(silu_and_mul(self.gate_up_proj(x)))
        return out


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, dtype: torch.dtype,
                 device: torch.device | str | None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.self_attn = Attention(cfg, layer, dtype, device)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.mlp = MLP(cfg, dtype, device)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, cos: torch.Tensor,
                sin: torch.Tensor, attn: AttentionBackend) -> tuple[torch.Tensor, torch.Tensor]:
        """(previous layer's output, running residual sum; None at the first layer) ->
        (this layer's output, residual). Each residual add is fused into the norm after it."""
        if residual is None:
            h, residual = self.input_layernorm(x), x
        else:
            h, residual = self.input_layernorm.add_and_norm(x, residual)
        h = self.self_attn(h, cos, sin, attn)
        h, residual = self.post_attention_layernorm.add_and_norm(h, residual)
        return self.mlp(h), residual


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype,
                 device: torch.device | str | None) -> None:
        super().__init__()
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size, dtype, device)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, dtype, device)
                                    for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta,
                                      cfg.rope, device)


class LlamaForCausalLM(nn.Module):
    # checkpoint module name -> (our fused module, shard)
    packed_modules: ClassVar[dict[str, tuple[str, str]]] = {
        "q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", "gate"), "up_proj": ("gate_up_proj", "up"),
    }

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.config = cfg
        self.dtype = dtype
        self.model = LlamaModel(cfg, dtype, device)
        if cfg.tie_word_embeddings:
            self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, False, dtype, "meta")
            self.lm_head.weight = self.model.embed_tokens.weight  # shared storage
        else:
            self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, False, dtype, device)
        self.fused: FusedDecode | None = None  # set by pack_weights where it applies
        self.eos_ids: frozenset[int] = frozenset()  # a GGUF's metadata sets them

    def pack_weights(self, wide_copy_limit: int | None = None) -> None:
        """After loading: put every projection's weight in its fastest layout
        (linear_kernels.pack). A tied LM head gets its own packed copy (the embedding lookup
        needs the plain table). bf16 weights on a CPU that emulates bf16 also get a float32
        copy for many-row products when all of them fit in `wide_copy_limit` bytes."""
        linears = [m for m in self.modules() if isinstance(m, Linear)]  # the LM head too
        limit = WIDE_COPY_LIMIT if wide_copy_limit is None else wide_copy_limit
        wide = sum(m.weight.numel() for m in linears
                   if isinstance(m.weight, torch.Tensor)) * 4 <= limit
        for module in linears:
            module.pack(wide)
        self.fused = FusedDecode.build(self)

    @property
    def quantized(self) -> bool:
        """Some projection multiplies block-quantized weights (activations stay float32)."""
        return any(not isinstance(m.weight, torch.Tensor) for m in self.modules()
                   if isinstance(m, Linear))

    def weight_types(self) -> tuple[dict[str, int], str, int]:
        """(bytes per weight type over the decoder layers' projections, the LM head's type,
        bytes of all weights, a tied head counted once) for describing how the model runs."""
        def kinds(w: linear_kernels.Weight) -> list[tuple[str, int]]:
            """(type, bytes) of a weight, per part of a SplitWeight."""
            if isinstance(w, torch.Tensor):
                return [(str(w.dtype).removeprefix("torch."), w.numel() * w.element_size())]
            parts = w.parts if isinstance(w, linear_kernels.SplitWeight) else (w,)
            return [(type_name(p.qtype), int(p.nbytes)) for p in parts]

        layers: dict[str, int] = {}
        seen: set[int] = set()
        total = 0
        for name, module in self.named_modules():
            w = getattr(module, "weight", None)
            if w is None or not isinstance(module, (Linear, Embedding, RMSNorm)):
                continue
            if id(w) not in seen:
                seen.add(id(w))
                total += sum(n for _, n in kinds(w))
            if isinstance(module, Linear) and name.startswith("model.layers."):
                for kind, n in kinds(w):
                    layers[kind] = layers.get(kind, 0) + n
        head = "/".join(sorted({k for k, _ in kinds(self.lm_head.weight)}))
        return layers, head, total

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend,
                logits_indices: torch.Tensor | None = None) -> torch.Tensor:
        """[T] ids and positions -> logits [S, vocab] for rows `logits_indices` (all if None).

        `attn` must be prepared for this round. The final norm and the LM head run only on
        the selected rows: prefill chunks that do not sample cost no vocab projection.
        """
        x = self.model.embed_tokens(input_ids)
        cos, sin = self.model.rotary(positions, x.dtype)
        residual: torch.Tensor | None = None
        fused = self.fused.run(x, cos, sin, attn) if self.fused is not None else None
        if fused is not None:  # a decode round of a few sequences: one C call per layer
            x, residual = fused
        else:
            for layer in self.model.layers:
                x, residual = layer(x, residual, cos, sin, attn)
        if logits_indices is not None:
            x = x.index_select(0, logits_indices)
            residual = None if residual is None else residual.index_select(0, logits_indices)
        h = (self.model.norm(x) if residual is None
             else self.model.norm.add_and_norm(x, residual)[0])
        return vocab_projection(h, self.lm_head)


LM_HEAD_BLOCK = 2048
# float32 copies of bf16 weights (emulated bf16 CPUs) are kept up to this size in all:
# 0.6 GB for SmolLM2-135M; a 1B model's would be 4 GB, so it widens per product instead
WIDE_COPY_LIMIT = 2 << 30


def vocab_projection(x: torch.Tensor, head: Linear) -> torch.Tensor:
    """x @ head.weight.T for the LM head. With a plain float32 weight on CPU and several rows,
    in blocks of the vocabulary: MKL is up to 2x slower on one [rows x 49152] product than on
    2048-column blocks that stay in cache (measured at 4-64 rows). The other products
    (oneDNN's, Ferry's bf16 kernel, per-block widening) block the vocabulary themselves."""
    weight = head.weight
    if head.product is not torch.nn.functional.linear or x.device.type != "cpu" \
            or x.shape[0] <= 1 or not isinstance(weight, torch.Tensor):
        projected: torch.Tensor = head(x)
        return projected
    out = x.new_empty(x.shape[0], weight.shape[0])
    for w, o in zip(torch.split(weight, LM_HEAD_BLOCK), torch.split(out, LM_HEAD_BLOCK, dim=1)):
        torch.mm(x, w.t(), out=o)
    return out
