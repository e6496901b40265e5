"""Qwen2 / Qwen2.5: the Llama decoder with biased q/k/v projections (none on o_proj)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from engine.execution.model.config import (
    GGUFMeta,
    LayerSpec,
    ModelConfig,
    RopeSpec,
    check_act,
    gguf_common,
    gguf_rope,
    hf_common,
    hf_rope,
)
from engine.execution.model.decoder import CausalLM


def qwen_windows(cfg: Mapping[str, Any]) -> list[int | None]:
    """Per layer: Qwen's sliding window, used only with use_sliding_window, on the layers
    `layer_types` marks (transformers 5) or from max_window_layers on (4)."""
    n = cfg["num_hidden_layers"]
    window = cfg.get("sliding_window")
    if not cfg.get("use_sliding_window") or not window:
        return [None] * n
    types = cfg.get("layer_types")
    if types:
        return [window if t == "sliding_attention" else None for t in types]
    first = cfg.get("max_window_layers", n)
    return [window if i >= first else None for i in range(n)]


class Qwen2ForCausalLM(CausalLM):
    hf_model_types = ("qwen2",)
    # "qwen2vl": Qwen2.5-VL's text model, whose M-RoPE is plain rope for text (its three
    # components are equal); with its projector file it is Qwen2_5_VLForConditionalGeneration
    gguf_archs: ClassVar[tuple[str, ...]] = ("qwen2", "qwen2vl")

    @classmethod
    def config_from_hf(cls, cfg: Mapping[str, Any]) -> ModelConfig:
        rope = hf_rope(cfg)
        return ModelConfig(**hf_common(cfg),
                           layers=tuple(LayerSpec(rope, w) for w in qwen_windows(cfg)),
                           qkv_bias=True, hidden_act=check_act(cfg, "hidden_act",
                                                               {"silu": "silu"}))

    @classmethod
    def config_from_gguf(cls, meta: GGUFMeta) -> ModelConfig:
        common = gguf_common(meta)
        rope = gguf_rope(meta)
        sections = meta.values.get(f"{meta.arch}.rope.dimension_sections")
        if sections:  # llama.cpp's M-RoPE sections: (time, row, column, unused)
            if any(int(n) for n in sections[3:]):
                raise meta.error(f"rope sections {list(sections)} are not Qwen2.5-VL's")
            rope = RopeSpec(rope.theta, {**rope.params,
                                         "mrope_section": [int(n) for n in sections[:3]]})
        return ModelConfig(**common, layers=(LayerSpec(rope),) * common["num_layers"])
