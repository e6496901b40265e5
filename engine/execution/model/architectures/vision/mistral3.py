"""Mistral 3 (Mistral Small 3.1 and 3.2): a Pixtral vision tower, a projector that norms its
rows, merges each 2 x 2 of them into one and maps them to the text model's width (two linear
layers, GELU between), and a Mistral text model. Pixtral 12B is the same but for the
projector: a LLaVA folder (`model_type: llava` over a `pixtral` tower) whose two linear
layers map each patch, neither normed nor merged (registry.for_hf sends it here).

A picture keeps about its own aspect (engine.vision.fit): rows x cols merged positions. The
processor writes `[IMG]` for each, `[IMG_BREAK]` after each row and `[IMG_END]` after the
last, so an image's span is rows x (cols + 1) positions. Ferry's span holds all of them: the
encoder returns the features with the two tokens' own embeddings between its rows, so the
text model reads at every position what transformers' does, and the prompt counts as many
tokens as transformers'.

From Hugging Face folders (`model_type: mistral3`, or `llava` over `pixtral`), and from GGUF:
the text model's file (llama.cpp's `mistral3`, or `llama` for Pixtral 12B, a Llama layout)
with the projector file its converter writes (`--mmproj`, projector type `pixtral`, with
`mm.patch_merger` for Mistral 3). The converter keeps the tower's q and k rows in its rotary
order, as it does a Llama's; they are put back here."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn
from torch.nn import functional

from engine.execution.model.architectures.text.llama import LlamaForCausalLM
from engine.execution.model.architectures.vision.llava import RENAMES
from engine.execution.model.config import ModelConfig, UnsupportedModel
from engine.execution.model.decoder import CausalLM
from engine.execution.model.encoder_steps import EncoderSteps
from engine.execution.model.layers import Linear, RMSNorm
from engine.execution.model.vision import VisionConfig, renamed, with_vision
from engine.execution.model.vision.config import PixtralViTConfig
from engine.execution.model.vision.pixtral import PixtralVisionTower
from engine.vision.fit import FitConfig

if TYPE_CHECKING:
    from engine.execution.loading.projector_gguf import ProjectorFile, ProjectorTensor

PLACEHOLDER = "[IMG]"
# llama.cpp's projector file: GGUF name -> this model's key (the tower's layers: LAYER_NAMES)
TOP_NAMES = {"v.patch_embd": "vision_tower.patch_conv", "v.pre_ln": "vision_tower.ln_pre",
             "mm.input_norm": "multi_modal_projector.norm",
             "mm.patch_merger": "multi_modal_projector.patch_merger.merging_layer",
             "mm.1": "multi_modal_projector.linear_1", "mm.2": "multi_modal_projector.linear_2"}
LAYER_NAMES = {"attn_q": "attention.q_proj", "attn_k": "attention.k_proj",
               "attn_v": "attention.v_proj", "attn_out": "attention.o_proj",
               "ln1": "attention_norm", "ln2": "ffn_norm", "ffn_gate": "feed_forward.gate_proj",
               "ffn_up": "feed_forward.up_proj", "ffn_down": "feed_forward.down_proj"}
# the [IMG_BREAK] row the converter copies out of the text model's embeddings: Ferry reads
# it (and [IMG_END]'s) from the text model itself
UNUSED = {"v.token_embd.img_break"}


class PatchMerger(nn.Module):
    """Each 2 x 2 block of a grid of rows side by side, as torch's unfold orders it (a row's
    width, then the block's row, then its column), through one linear layer back to one
    row's width."""

    def __init__(self, width: int, merge: int, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        super().__init__()
        self.merge = merge
        self.merging_layer = Linear(width * merge ** 2, width, False, dtype, device)

    def forward(self, x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
        """[rows * cols, D] -> [rows / m * cols / m, D], row by row."""
        m, d = self.merge, x.shape[-1]
        blocks = x.view(rows // m, m, cols // m, m, d).permute(0, 2, 4, 1, 3)
        out: torch.Tensor = self.merging_layer(blocks.reshape(-1, d * m * m))
        return out


class Mistral3Projector(nn.Module):
    def __init__(self, tower: PixtralViTConfig, text_width: int, eps: float, bias: bool,
                 dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.norm: RMSNorm | None = None
        self.patch_merger: PatchMerger | None = None
        if tower.patch_merger:
            self.norm = RMSNorm(tower.hidden_size, eps, dtype, device)
            self.patch_merger = PatchMerger(tower.hidden_size, tower.spatial_merge_size, dtype,
                                            device)
        self.linear_1 = Linear(tower.hidden_size, text_width, bias, dtype, device)
        self.linear_2 = Linear(text_width, text_width, bias, dtype, device)

    def forward(self, x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
        """A grid of rows x cols features [rows * cols, D] -> merged [rows * cols / m^2,
        text width] (Pixtral 12B's: m = 1, each row as it is)."""
        if self.norm is not None and self.patch_merger is not None:
            x = self.patch_merger(self.norm(x), rows, cols)
        out: torch.Tensor = self.linear_2(functional.gelu(self.linear_1(x)))
        return out


class Mistral3ForConditionalGeneration(CausalLM):
    hf_model_types = ("mistral3",)
    projector_type = "pixtral"  # llama.cpp's name, Mistral 3's and Pixtral 12B's
    projector_text_archs: ClassVar[tuple[str, ...]] = ("mistral3", "llama")

    @classmethod
    def config_from_hf(cls, cfg: Mapping[str, Any]) -> ModelConfig:
        """Mistral 3's config.json, or Pixtral 12B's (`llava` over a `pixtral` tower)."""
        llava = cfg.get("model_type") == "llava"
        name = "Pixtral" if llava else "Mistral 3"
        text = dict(cfg.get("text_config") or {})
        if text.get("model_type", "mistral") not in ("mistral", "llama"):
            raise UnsupportedModel(f"{name} over a {text.get('model_type')!r} text model is "
                                   "not supported (supported: mistral)")
        text.setdefault("model_type", "mistral")
        vision = cfg.get("vision_config") or {}
        if vision.get("model_type", "pixtral") != "pixtral":
            raise UnsupportedModel(f"{name} with a {vision.get('model_type')!r} tower is "
                                   "not supported (supported: pixtral)")
        if cfg.get("vision_feature_layer", -1) != -1:
            raise UnsupportedModel(f"{name} with features from another layer than the last "
                                   "is not supported")
        if llava and cfg.get("vision_feature_select_strategy", "full") != "full":
            raise UnsupportedModel("a Pixtral tower's features are taken whole "
                                   "(vision_feature_select_strategy full)")
        if str(cfg.get("projector_hidden_act", "gelu")) != "gelu":
            raise UnsupportedModel("projector_hidden_act must be gelu")
        # LLaVA's projector has biases unless it says; Mistral 3's none unless it says
        merge = 1 if llava else int(cfg.get("spatial_merge_size", 2))
        tower = replace(PixtralViTConfig.from_hf(vision, merge), patch_merger=not llava,
                        projector_bias=bool(cfg.get("multimodal_projector_bias", llava)))
        # 0 positions per image: each its own, from its size
        spec = VisionConfig(tower, int(cfg.get("image_token_index", 10)), 0, PLACEHOLDER,
                            FitConfig(longest_edge=tower.image_size, unit=tower.unit))
        return with_vision(LlamaForCausalLM.config_from_hf(text), "mistral3", spec, cfg)

    @classmethod
    def config_from_projector(cls, text: ModelConfig, projector: ProjectorFile,
                              token_id: Callable[[str], int | None]) -> ModelConfig:
        """The tower from the projector file's metadata (rotary base: Pixtral's 10000, which
        the file does not hold), the row tokens from the text file's vocabulary. Without
        `mm.patch_merger` the file is Pixtral 12B's: each patch mapped, none merged."""
        merges = "mm.patch_merger.weight" in projector.tensors
        if not merges and "mm.input_norm.weight" in projector.tensors:
            raise UnsupportedModel(f"{projector.path.name}: a `pixtral` projector with "
                                   "mm.input_norm but no mm.patch_merger is neither Mistral "
                                   "3's (both) nor Pixtral 12B's (neither)")
        hidden, heads = int(projector.get("embedding_length")), \
            int(projector.get("attention.head_count"))
        use_silu = bool(projector.meta.get("clip.use_silu", False))
        tower = PixtralViTConfig(
            hidden_size=hidden, intermediate_size=int(projector.get("feed_forward_length")),
            num_heads=heads, head_dim=hidden // heads, layers=int(projector.get("block_count")),
            image_size=int(projector.get("image_size")),
            patch_size=int(projector.get("patch_size")),
            spatial_merge_size=int(projector.get("spatial_merge_size", 2)) if merges else 1,
            patch_merger=merges,
            hidden_act="silu" if use_silu else "gelu",
            break_token_id=projector.image_token(token_id, "[IMG_BREAK]"),
            end_token_id=projector.image_token(token_id, "[IMG_END]"),
            projector_bias="mm.1.bias" in projector.tensors)
        mean, std = projector.mean_std()
        spec = VisionConfig(tower, projector.image_token(token_id, PLACEHOLDER), 0, PLACEHOLDER,
                            FitConfig(longest_edge=tower.image_size, unit=tower.unit,
                                      mean=mean, std=std))
        return with_vision(text, "mistral3", spec, {})

    @classmethod
    def projector_tensors(cls, projector: ProjectorFile,
                          config: ModelConfig) -> dict[str, ProjectorTensor]:
        tower: PixtralViTConfig = config.vision.tower
        out: dict[str, ProjectorTensor] = {}
        for name in projector.tensors:
            stem, _, part = name.rpartition(".")
            layer = stem.split(".")
            if stem in TOP_NAMES:
                out[f"{TOP_NAMES[stem]}.{part}"] = projector.tensors[name]
            elif len(layer) == 4 and layer[:2] == ["v", "blk"] and layer[3] in LAYER_NAMES:
                key = f"vision_tower.transformer.layers.{layer[2]}.{LAYER_NAMES[layer[3]]}.{part}"
                out[key] = projector.unpermuted(name, tower.num_heads) \
                    if layer[3] in ("attn_q", "attn_k") else projector.tensors[name]
            elif name not in UNUSED and stem not in UNUSED:
                raise UnsupportedModel(f"{projector.path}: tensor {name} is not one Ferry "
                                       "knows for a 'pixtral' projector")
        return out

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> None:
        super().__init__(cfg, dtype, device)
        spec: VisionConfig = cfg.vision
        tower: PixtralViTConfig = spec.tower  # type: ignore[assignment]
        where = device if device is not None else "cpu"
        self.vision_tower = PixtralVisionTower(tower, dtype, where)
        self.multi_modal_projector = Mistral3Projector(
            tower, cfg.hidden_size, cfg.rms_norm_eps, tower.projector_bias, dtype, where)

    @classmethod
    def hf_key(cls, key: str) -> str:
        return renamed(key, RENAMES)

    def encode_steps(self, pixels: torch.Tensor, grid: tuple[int, int] | None = None,
                     size: tuple[int, int] | None = None) -> EncoderSteps:
        """Images of one size [B, 3, H, W] -> [B, rows * (cols + 1), hidden]: each row of
        merged positions followed by [IMG_BREAK]'s embedding, the last by [IMG_END]'s."""
        tower: PixtralViTConfig = self.config.vision.tower
        p, m = tower.patch_size, tower.spatial_merge_size
        rows, cols = pixels.shape[-2] // p, pixels.shape[-1] // p
        ids = torch.tensor([tower.break_token_id, tower.end_token_id], device=pixels.device)
        brk, end = self.model.embed_tokens(ids).to(self.dtype)  # [hidden] each
        out = []
        for image in pixels:
            features = yield from self.vision_tower.steps(image.to(self.dtype))
            merged = self.multi_modal_projector(features, rows, cols)  # [R * C, hidden]
            grid_rows = merged.view(rows // m, cols // m, -1)
            tail = brk.expand(rows // m, 1, -1).clone()
            tail[-1, 0] = end
            out.append(torch.cat([grid_rows, tail], dim=1).reshape(-1, merged.shape[-1]))
        return torch.stack(out)
