"""Qwen2.5-VL: its own vision transformer (window attention, 2D rotary, 2 x 2 patches merged
into one position), over a Qwen2 text model whose rotary embedding is M-RoPE.

An image keeps its aspect ratio: the processor resizes it to a multiple of 28 pixels a side
(engine.vision.patches), so its positions are a grid of rows x cols that varies by image.
M-RoPE gives every position three components (time, row, column): text has the same number
in all three, an image's positions count its rows and columns from where it starts
(engine.vision.placement.mrope_positions). The chat template writes
`<|vision_start|><|image_pad|><|vision_end|>` for an image part; the one `<|image_pad|>` is
repeated to the image's positions.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from engine.execution.model.architectures.text.qwen2 import Qwen2ForCausalLM
from engine.execution.model.config import ModelConfig, UnsupportedModel
from engine.execution.model.encoder_steps import EncoderSteps
from engine.execution.model.vision import (
    QwenVisionTower,
    QwenViTConfig,
    VisionConfig,
    renamed,
    with_vision,
)
from engine.vision import PatchConfig

if TYPE_CHECKING:
    from engine.execution.loading.projector_gguf import ProjectorFile, ProjectorTensor

# checkpoint prefixes (transformers 5 and 4 layouts) -> this model's module names
RENAMES = (("model.language_model.", "model."), ("model.visual.", "visual."))
PAD = "<|image_pad|>"  # the image token; the template writes it once an image


def _text_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The text model's config.json fields: `text_config` (transformers 5) or the top
    level (4), with M-RoPE's rope written as the default rope plus its sections."""
    text = dict(cfg.get("text_config") or {k: v for k, v in cfg.items()
                                           if k != "vision_config"})
    rope = dict(text.pop("rope_parameters", None) or text.pop("rope_scaling", None) or {})
    text.pop("rope_scaling", None)
    kind = rope.pop("type", rope.get("rope_type", "default"))
    if kind not in ("mrope", "default"):
        raise UnsupportedModel(f"Qwen2.5-VL with rope_type {kind!r} is not supported")
    rope["rope_type"] = "default"
    sections = rope.get("mrope_section")
    if not sections or len(sections) != 3:
        raise UnsupportedModel("Qwen2.5-VL's rope needs its three mrope_section sizes")
    text["rope_parameters"] = rope
    text["model_type"] = "qwen2"
    return text


def _with_vision(text: ModelConfig, tower: QwenViTConfig, patches: PatchConfig, token: int,
                 cfg: Mapping[str, Any]) -> ModelConfig:
    if tower.out_hidden_size != text.hidden_size:
        raise UnsupportedModel(f"the vision tower's output ({tower.out_hidden_size}) is "
                               f"not the text model's width ({text.hidden_size})")
    if not all(layer.rope.params.get("mrope_section") for layer in text.layers):
        raise UnsupportedModel("Qwen2.5-VL's text model needs M-RoPE's sections")
    # tokens_per_image 0: each image its own number of positions
    spec = VisionConfig(tower, token, 0, PAD, patches, image_text=PAD)
    return with_vision(text, "qwen2_5_vl", spec, cfg)


# llama.cpp's names for a tower layer's tensors (after "v.blk.N.") -> the module's; q, k
# and v are joined into qkv (projector_tensors)
LAYER_NAMES = {"attn_out": "attn.proj", "ln1": "norm1", "ln2": "norm2",
               "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
TOP_NAMES = {"v.post_ln": "visual.merger.ln_q", "mm.0": "visual.merger.mlp.0",
             "mm.2": "visual.merger.mlp.2"}


class Qwen2_5_VLForConditionalGeneration(Qwen2ForCausalLM):
    hf_model_types = ("qwen2_5_vl",)
    gguf_archs: ClassVar[tuple[str, ...]] = ()  # a GGUF "qwen2vl" is the text model's
    projector_type = "qwen2.5vl_merger"  # llama.cpp's name for it
    projector_text_archs = ("qwen2vl",)
    projector_tower = "visual"

    @classmethod
    def config_from_hf(cls, cfg: Mapping[str, Any]) -> ModelConfig:
        tower = QwenViTConfig.from_hf(cfg.get("vision_config") or {})
        text = Qwen2ForCausalLM.config_from_hf(_text_config(cfg))
        patches = PatchConfig(patch_size=tower.patch_size, merge_size=tower.spatial_merge_size,
                              temporal_patch_size=tower.temporal_patch_size)
        token = int(cfg.get("image_token_id", cfg.get("image_token_index", 151655)))
        return _with_vision(text, tower, patches, token, cfg)

    @classmethod
    def config_from_projector(cls, text: ModelConfig, projector: ProjectorFile,
                              token_id: Callable[[str], int | None]) -> ModelConfig:
        """The tower from the projector's metadata: llama.cpp's converter writes the window
        pattern (every n-th layer attends over the whole image), not the window or merge
        size, which it takes as Qwen2.5-VL's 112 pixels and 2 where absent."""
        depth, every = int(projector.get("block_count")), int(projector.get("n_wa_pattern"))
        if every < 1:
            raise UnsupportedModel(f"{projector.path}: n_wa_pattern {every}")
        tower = QwenViTConfig(
            depth=depth, hidden_size=int(projector.get("embedding_length")),
            intermediate_size=int(projector.get("feed_forward_length")),
            num_heads=int(projector.get("attention.head_count")),
            out_hidden_size=int(projector.get("projection_dim")),
            patch_size=int(projector.get("patch_size")),
            spatial_merge_size=int(projector.get("spatial_merge_size", 2)),
            window_size=int(projector.get("window_size", 112)),
            fullatt_block_indexes=tuple(range(every - 1, depth, every)))
        mean, std = projector.mean_std()
        patches = PatchConfig(patch_size=tower.patch_size, merge_size=tower.spatial_merge_size,
                              mean=mean, std=std)
        low, high = projector.get("image_min_pixels", 0), projector.get("image_max_pixels", 0)
        if low and high:
            patches = replace(patches, min_pixels=int(low), max_pixels=int(high))
        return _with_vision(text, tower, patches, projector.image_token(token_id, PAD), {})

    @classmethod
    def projector_tensors(cls, projector: ProjectorFile,
                          config: ModelConfig) -> dict[str, ProjectorTensor]:
        """llama.cpp's converter splits the checkpoint's fused tensors: each layer's qkv
        into q, k and v, the Conv3d patch embedding into one kernel per frame
        (`v.patch_embd.weight` and `.weight.1`). They are joined back here."""
        names = set(projector.tensors)
        out = {"visual.patch_embed.proj.weight": projector.joined(
            ["v.patch_embd.weight", "v.patch_embd.weight.1"], 2, stack=True)}
        names -= {"v.patch_embd.weight", "v.patch_embd.weight.1"}
        for i in range(config.vision.tower.depth):
            for part in ("weight", "bias"):
                qkv = [f"v.blk.{i}.attn_{x}.{part}" for x in "qkv"]
                out[f"visual.blocks.{i}.attn.qkv.{part}"] = projector.joined(qkv, 0)
                names -= set(qkv)
        for name in sorted(names):
            stem, part = name.rsplit(".", 1)
            layer = stem.split(".")
            if stem in TOP_NAMES:
                key = f"{TOP_NAMES[stem]}.{part}"
            elif len(layer) == 4 and layer[:2] == ["v", "blk"] and layer[3] in LAYER_NAMES:
                key = f"visual.blocks.{layer[2]}.{LAYER_NAMES[layer[3]]}.{part}"
            else:
                raise UnsupportedModel(f"{projector.path}: tensor {name} is not one Ferry "
                                       "knows for a 'qwen2.5vl_merger' projector")
            out[key] = projector.tensors[name]
        return out

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> None:
        super().__init__(cfg, dtype, device)
        spec: VisionConfig = cfg.vision
        processor = spec.processor
        tower: QwenViTConfig = spec.tower  # type: ignore[assignment]
        if not isinstance(processor, PatchConfig) or (
                processor.patch_size, processor.merge_size, processor.temporal_patch_size) != (
                tower.patch_size, tower.spatial_merge_size, tower.temporal_patch_size):
            raise UnsupportedModel("the image processor's patches differ from the vision "
                                   "tower's")
        self.visual = QwenVisionTower(tower, dtype, device if device is not None else "cpu")

    @classmethod
    def hf_key(cls, key: str) -> str:
        return renamed(key, RENAMES)

    def encode_steps(self, pixels: torch.Tensor, grid: tuple[int, int] | None = None,
                     size: tuple[int, int] | None = None) -> EncoderSteps:
        """Images of the same grid of positions [B, patches, 3 * 2 * 14 * 14], `grid` their
        (rows, cols) of positions -> [B, rows * cols, hidden]."""
        if grid is None:
            raise ValueError("a Qwen2.5-VL image needs its grid of positions")
        merge = self.config.vision.tower.spatial_merge_size
        patch_grid = (grid[0] * merge, grid[1] * merge)
        rows = []
        for p in pixels:
            rows.append((yield from self.visual.steps(p.to(self.dtype), patch_grid)))
        return torch.stack(rows)
