"""LLaVA 1.6 (LLaVA-NeXT): LLaVA's CLIP tower, MLP projector and Llama (or Mistral) text
model, with pictures at higher resolution ("anyres", engine.vision.anyres).

A picture is the whole picture squeezed to one tile plus a grid of tiles at the resolution of
`image_grid_pinpoints` that fits it best. Every tile goes through the tower and projector as
one LLaVA 1.5 image does. Then the whole picture's rows come first; the tiles' rows are
joined into one grid, its padding cut away, and a learned `image_newline` row ends each of
its rows. A picture's positions thus depend on its size: the prompt holds as many `<image>`
tokens as FeatureLayout.length counts.

From Hugging Face folders (`model_type: llava_next`, the "default" feature strategy), and
from GGUF: a `llama` text file with the projector file llama.cpp's legacy scripts write for
LLaVA 1.6 (an `mlp` projector with `image_grid_pinpoints` and `model.image_newline`). Both
pack the tiles' features as transformers does (`spatial_unpad`).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from engine.execution.model.architectures.text.llama import LlamaForCausalLM
from engine.execution.model.architectures.vision.llava import (
    RENAMES,
    LlavaForConditionalGeneration,
    checked_hf,
    image_token,
)
from engine.execution.model.config import ModelConfig, UnsupportedModel
from engine.execution.model.encoder_steps import EncoderSteps
from engine.execution.model.vision import VisionConfig, renamed, with_vision
from engine.vision.anyres import AnyresConfig, layout, pinpoints

if TYPE_CHECKING:
    from engine.execution.loading.projector_gguf import ProjectorFile


class LlavaNextForConditionalGeneration(LlavaForConditionalGeneration):
    hf_model_types = ("llava_next",)
    # llama.cpp's legacy script writes LLaVA 1.6's projector as an `mlp` one, as 1.5's, with
    # image_grid_pinpoints (registry.for_projector tells them apart)
    projector_type = ""
    projector_names: ClassVar[Mapping[str, str]] = {
        **LlavaForConditionalGeneration.projector_names,
        "model.image_newline": "image_newline", "v.image_newline": "image_newline"}

    @classmethod
    def config_from_hf(cls, cfg: Mapping[str, Any]) -> ModelConfig:
        # "full" keeps the class token: a tile's features no longer make a square grid
        text, tower, _ = checked_hf(cfg, ("default",))
        processor = AnyresConfig(tile=tower.image_size, pinpoints=pinpoints(
            cfg.get("image_grid_pinpoints") or AnyresConfig().pinpoints))
        # 0 positions per image: each picture its own, from its size
        spec = VisionConfig(tower, image_token(cfg), 0, "<image>", processor)
        return with_vision(LlamaForCausalLM.config_from_hf(text), "llava_next", spec, cfg)

    @classmethod
    def config_from_projector(cls, text: ModelConfig, projector: ProjectorFile,
                              token_id: Callable[[str], int | None]) -> ModelConfig:
        """LLaVA 1.5's reading of the file, with the picture cut into tiles at its
        pinpoints: stored flat, width then height of each, as llama.cpp reads them (the
        original LLaVA's order; transformers' configs list height first)."""
        base = super().config_from_projector(text, projector, token_id)
        merge = projector.get("mm_patch_merge_type", "spatial_unpad")
        flat = [int(v) for v in projector.get("image_grid_pinpoints")]
        if merge != "spatial_unpad" or len(flat) % 2:
            raise UnsupportedModel(f"{projector.path.name}: a LLaVA 1.6 projector with "
                                   f"mm_patch_merge_type {merge!r} and {len(flat)} pinpoint "
                                   "values is not supported (spatial_unpad, pairs)")
        spec = base.vision
        processor = AnyresConfig(pinpoints=pinpoints(zip(flat[1::2], flat[::2], strict=True)),
                                 tile=spec.vit.image_size, mean=spec.processor.mean,
                                 std=spec.processor.std)
        return replace(base, model_type="llava_next",
                       vision=replace(spec, tokens_per_image=0, processor=processor))

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> None:
        super().__init__(cfg, dtype, device)
        self.image_newline = nn.Parameter(
            torch.empty(cfg.hidden_size, dtype=dtype,
                        device=device if device is not None else "cpu"), requires_grad=False)

    @classmethod
    def hf_key(cls, key: str) -> str:
        return renamed(key, (("model.image_newline", "image_newline"), *RENAMES))

    def encode_steps(self, pixels: torch.Tensor, grid: tuple[int, int] | None = None,
                     size: tuple[int, int] | None = None) -> EncoderSteps:
        """Pictures of one `size` as tiles [B, 1 + tiles, 3, S, S] (the whole picture first)
        -> [B, positions, hidden]."""
        if size is None or pixels.dim() != 5:
            raise ValueError("a LLaVA-NeXT picture is its tiles and its size")
        vit = self.config.vision.vit
        processor: AnyresConfig = self.config.vision.processor
        at = layout(size, processor, vit.image_size // vit.patch_size)
        b, tiles = pixels.shape[:2]
        if tiles != 1 + at.rows * at.cols:
            raise ValueError(f"a {size[0]} x {size[1]} picture takes {1 + at.rows * at.cols} "
                             f"tiles, not {tiles}")
        features = yield from super().encode_steps(pixels.flatten(0, 1))  # [B*T, side², D]
        s, d = at.side, features.shape[-1]
        features = features.view(b, tiles, s * s, d)
        whole = features[:, 0]  # [B, side², D]
        joined = features[:, 1:].reshape(b, at.rows, at.cols, s, s, d).permute(0, 1, 3, 2, 4, 5)
        kept = joined.reshape(b, at.rows * s, at.cols * s, d)[:, at.top:at.bottom,
                                                                at.left:at.right]
        newline = self.image_newline.to(kept.dtype).expand(b, kept.shape[1], 1, d)
        rows = torch.cat([kept, newline], dim=2).reshape(b, -1, d)  # [B, h * (w + 1), D]
        return torch.cat([whole, rows], dim=1)
