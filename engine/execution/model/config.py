"""What a model is, independent of where its weights come from: the frozen ModelConfig and the
per-layer spec (attention window, rotary embedding) that says what differs between layers.

Each architecture file reads its Hugging Face config.json and its GGUF metadata into these;
the shared layers read only these.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

ROPE_TYPES = ("default", "linear", "llama3", "longrope")


class UnsupportedModel(ValueError):
    """The checkpoint's architecture or settings are outside what Ferry implements."""


@dataclass(frozen=True)
class RopeSpec:
    """One rotary embedding: base `theta` and Hugging Face's scaling parameters
    (`rope_type` in ROPE_TYPES and its fields)."""

    theta: float
    params: Mapping[str, Any] = field(default_factory=lambda: {"rope_type": "default"})

    @property
    def kind(self) -> str:
        return str(self.params.get("rope_type", "default"))


@dataclass(frozen=True)
class LayerSpec:
    """What one decoder layer does differently: `window` (attend over the last this many
    positions; None: all of them), its rotary embedding, and whether its MLP is the
    config's mixture of experts."""

    rope: RopeSpec
    window: int | None = None
    moe: bool = False


@dataclass(frozen=True)
class MoESpec:
    """A mixture-of-experts MLP: `experts` experts of `intermediate_size`, `top_k` of them
    per token, their router weights renormalised to sum 1 when `normalize`."""

    experts: int
    top_k: int
    intermediate_size: int
    normalize: bool = True


@dataclass(frozen=True)
class ModelConfig:
    model_type: str  # the architecture's name in the registry
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    layers: tuple[LayerSpec, ...]
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    attn_scale: float | None = None  # one for every layer; None: head_dim ** -0.5
    hidden_act: str = "silu"  # of the gated MLP: silu or gelu_tanh
    embed_scale: float | None = None  # embeddings multiplied by this (Gemma: sqrt(hidden))
    final_softcap: float | None = None  # logits = cap * tanh(logits / cap)
    moe: MoESpec | None = None
    # a vision family's image side (engine.execution.model.vision.VisionConfig); None: text
    vision: Any = None

    def __post_init__(self) -> None:
        if len(self.layers) != self.num_layers:
            raise ValueError(f"{len(self.layers)} layer specs for {self.num_layers} layers")

    @property
    def scale(self) -> float:
        return self.attn_scale if self.attn_scale is not None else self.head_dim ** -0.5

    @property
    def windows(self) -> tuple[int | None, ...]:
        return tuple(spec.window for spec in self.layers)

    @property
    def sliding_window(self) -> int | None:
        """The widest window of a sliding layer (None: every layer attends to all)."""
        return max((w for w in self.windows if w), default=None)

    @property
    def max_context(self) -> int:
        """Longest sequence computed exactly: sliding-window layers are masked to their
        window, so that is the model's own position limit."""
        return self.max_position_embeddings


def hf_rope(cfg: Mapping[str, Any], params: Mapping[str, Any] | None = None) -> RopeSpec:
    """A config.json's rope (transformers 5 `rope_parameters`, 4 `rope_theta` +
    `rope_scaling`), checked against ROPE_TYPES; `params`: one entry of a per-layer-type
    `rope_parameters`."""
    rope = dict(params if params is not None else
                (cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}))
    if any(isinstance(v, dict) for v in rope.values()):
        raise UnsupportedModel("per-layer-type rope parameters are not supported here")
    theta = float(rope.pop("rope_theta", cfg.get("rope_theta", 10000.0)))
    rope.setdefault("rope_type", rope.pop("type", "default"))
    rope.pop("type", None)
    if rope["rope_type"] not in ROPE_TYPES:
        raise UnsupportedModel(f"rope_type {rope['rope_type']!r} is not supported "
                               f"(supported: {', '.join(ROPE_TYPES)})")
    if float(rope.pop("partial_rotary_factor", cfg.get("partial_rotary_factor") or 1.0)) != 1.0:
        raise UnsupportedModel("a partial rotary embedding (partial_rotary_factor) is not "
                               "supported")
    if rope["rope_type"] in ("llama3", "longrope"):
        rope.setdefault("original_max_position_embeddings",
                        cfg.get("original_max_position_embeddings",
                                cfg["max_position_embeddings"]))
    if rope["rope_type"] == "longrope":  # Phi-3's: the factor is the context's growth
        rope.setdefault("factor", cfg["max_position_embeddings"]
                        / rope["original_max_position_embeddings"])
    return RopeSpec(theta, rope)


def hf_common(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The ModelConfig fields every architecture reads the same way from config.json."""
    heads = cfg["num_attention_heads"]
    return {
        "model_type": cfg["model_type"], "vocab_size": cfg["vocab_size"],
        "hidden_size": cfg["hidden_size"], "intermediate_size": cfg["intermediate_size"],
        "num_layers": cfg["num_hidden_layers"], "num_heads": heads,
        "num_kv_heads": cfg.get("num_key_value_heads") or heads,
        "head_dim": cfg.get("head_dim") or cfg["hidden_size"] // heads,
        "rms_norm_eps": cfg.get("rms_norm_eps", 1e-6),
        "max_position_embeddings": cfg.get("max_position_embeddings", 4096),
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False)),
    }


def check_act(cfg: Mapping[str, Any], key: str, allowed: Mapping[str, str]) -> str:
    """The gated MLP's activation named by cfg[key], as ModelConfig.hidden_act."""
    act = cfg.get(key) or next(iter(allowed))
    if act not in allowed:
        raise UnsupportedModel(f"{key} {act!r} is not supported "
                               f"(supported: {', '.join(allowed)})")
    return allowed[act]


class GGUFMeta:
    """A GGUF file's metadata for an architecture's `config_from_gguf`: `get` reads
    `<arch>.<key>` (a missing key without default, or a per-layer array, is an error naming
    the file), `tensors` the file's tensor names -> shapes (torch order), `floats` a small
    float tensor's values (e.g. Phi-3's LongRoPE factors)."""

    _MISSING: Any = object()

    def __init__(self, where: str, arch: str, values: Mapping[str, Any],
                 tensors: Mapping[str, tuple[int, ...]],
                 read: Callable[[str], list[float]] | None = None) -> None:
        self.where, self.arch, self.values, self.tensors = where, arch, values, tensors
        self._read = read

    def floats(self, name: str) -> list[float]:
        if self._read is None or name not in self.tensors:
            raise self.error(f"tensor {name} is missing")
        return self._read(name)

    def get(self, key: str, default: Any = _MISSING) -> Any:
        from engine.execution.errors import ModelFileError

        value = self.values.get(f"{self.arch}.{key}")
        if value is None:
            if default is self._MISSING:
                raise ModelFileError(f"{self.where}: metadata {self.arch}.{key} is missing")
            return default
        if isinstance(value, list):
            raise ModelFileError(f"{self.where}: per-layer {self.arch}.{key} is not supported")
        return value

    def error(self, what: str) -> Exception:
        from engine.execution.errors import ModelFileError

        return ModelFileError(f"{self.where}: {what}")


def gguf_rope(meta: GGUFMeta, theta: float | None = None) -> RopeSpec:
    """The file's rope: base (or `theta`) and linear scaling, the only kind GGUF metadata
    spells out (llama.cpp keeps Llama 3's as a rope_freqs tensor)."""
    base = float(meta.get("rope.freq_base", 10000.0)) if theta is None else theta
    kind = meta.get("rope.scaling.type", "none")
    if kind == "linear":
        return RopeSpec(base, {"rope_type": "linear",
                               "factor": float(meta.get("rope.scaling.factor"))})
    if kind not in ("none", ""):
        raise meta.error(f"rope scaling {kind!r} is not supported")
    return RopeSpec(base)


def gguf_common(meta: GGUFMeta) -> dict[str, Any]:
    """The ModelConfig fields every architecture reads the same way from GGUF metadata."""
    hidden = int(meta.get("embedding_length"))
    heads = int(meta.get("attention.head_count"))
    embed = meta.tensors.get("token_embd.weight")
    if embed is None:
        raise meta.error("tensor token_embd.weight is missing")
    return {
        "model_type": meta.arch, "vocab_size": int(meta.get("vocab_size", 0) or embed[0]),
        "hidden_size": hidden, "intermediate_size": int(meta.get("feed_forward_length")),
        "num_layers": int(meta.get("block_count")), "num_heads": heads,
        "num_kv_heads": int(meta.get("attention.head_count_kv", heads)),
        "head_dim": int(meta.get("attention.key_length", hidden // heads)),
        "rms_norm_eps": float(meta.get("attention.layer_norm_rms_epsilon")),
        "max_position_embeddings": int(meta.get("context_length")),
        "tie_word_embeddings": "output.weight" not in meta.tensors,
        "qkv_bias": "blk.0.attn_q.bias" in meta.tensors,
        "o_bias": "blk.0.attn_output.bias" in meta.tensors,
        "mlp_bias": "blk.0.ffn_up.bias" in meta.tensors,
    }
