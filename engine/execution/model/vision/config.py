"""What a vision family reads of its checkpoint: the tower's shape, which layer's output it
takes, the projector, and how images sit in the prompt."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from engine.vision import AnyresConfig, FitConfig, PatchConfig, ProcessorConfig, TilingConfig

if TYPE_CHECKING:
    from engine.execution.model.config import ModelConfig


@dataclass(frozen=True, slots=True)
class TowerConfig:
    """A ViT image encoder (CLIP's or SigLIP's): patches of `patch_size`, `layers` run of
    the checkpoint's (the rest are never used and never loaded)."""

    hidden_size: int
    intermediate_size: int
    num_heads: int
    layers: int
    image_size: int
    patch_size: int
    layer_norm_eps: float
    hidden_act: str  # quick_gelu (CLIP), gelu_tanh (SigLIP)
    class_token: bool  # CLIP prepends one (and a pre-layernorm); SigLIP does not

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @classmethod
    def from_hf(cls, cfg: Mapping[str, Any], defaults: TowerConfig,
                layers: int | None = None) -> TowerConfig:
        """The tower a checkpoint's `vision_config` describes; what it leaves out is its
        family's (`defaults`); `layers`: how many of them run (default: all)."""
        return cls(
            hidden_size=int(cfg.get("hidden_size", defaults.hidden_size)),
            intermediate_size=int(cfg.get("intermediate_size", defaults.intermediate_size)),
            num_heads=int(cfg.get("num_attention_heads", defaults.num_heads)),
            layers=layers or int(cfg.get("num_hidden_layers", defaults.layers)),
            image_size=int(cfg.get("image_size", defaults.image_size)),
            patch_size=int(cfg.get("patch_size", defaults.patch_size)),
            layer_norm_eps=float(cfg.get("layer_norm_eps", defaults.layer_norm_eps)),
            hidden_act=str(cfg.get("hidden_act", defaults.hidden_act)),
            class_token=defaults.class_token)


@dataclass(frozen=True, slots=True)
class QwenViTConfig:
    """Qwen2.5-VL's vision transformer (vision.qwen_vit): its shape; the patch, merge and
    window sizes are in pixels or patches as the checkpoint gives them."""

    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    out_hidden_size: int  # the text model's width: the merger's output
    patch_size: int = 14
    temporal_patch_size: int = 2  # an image is its frame twice (the processor repeats it)
    spatial_merge_size: int = 2
    window_size: int = 112  # in pixels: 112 / 14 = windows of 8 x 8 patches
    fullatt_block_indexes: tuple[int, ...] = (7, 15, 23, 31)
    hidden_act: str = "silu"
    in_channels: int = 3
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        """The width of one flattened patch: channels x frames x pixels x pixels."""
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

    @property
    def window_groups(self) -> int:
        """A window's side in merge groups."""
        return self.window_size // self.spatial_merge_size // self.patch_size

    @classmethod
    def from_hf(cls, cfg: Mapping[str, Any]) -> QwenViTConfig:
        """The tower a Qwen2.5-VL `vision_config` describes (transformers 4's names or 5's);
        what it leaves out is Qwen2.5-VL 3B's."""
        def key(*names: str, default: Any) -> Any:
            return next((cfg[n] for n in names if cfg.get(n) is not None), default)

        rope = cfg.get("rope_parameters") or {}
        return cls(
            depth=int(key("depth", "num_hidden_layers", default=32)),
            hidden_size=int(key("hidden_size", default=1280)),
            intermediate_size=int(key("intermediate_size", default=3420)),
            num_heads=int(key("num_heads", "num_attention_heads", default=16)),
            out_hidden_size=int(key("out_hidden_size", default=2048)),
            patch_size=int(key("patch_size", "spatial_patch_size", default=14)),
            temporal_patch_size=int(key("temporal_patch_size", default=2)),
            spatial_merge_size=int(key("spatial_merge_size", default=2)),
            window_size=int(key("window_size", default=112)),
            fullatt_block_indexes=tuple(int(i) for i in key("fullatt_block_indexes",
                                                            default=(7, 15, 23, 31))),
            hidden_act=str(key("hidden_act", default="silu")),
            in_channels=int(key("in_channels", "in_chans", default=3)),
            rope_theta=float(rope.get("rope_theta") or key("rope_theta", default=10000.0)))


@dataclass(frozen=True, slots=True)
class PixtralViTConfig:
    """The Pixtral vision transformer (vision.pixtral) of Mistral 3 and Pixtral 12B: an image
    at its own size (sides a multiple of patch_size x spatial_merge_size) as its grid of
    patches, 2D rotary positions by row and column; Mistral 3's projector then merges 2 x 2
    patches (`patch_merger`), Pixtral 12B's maps each patch."""

    hidden_size: int
    intermediate_size: int
    num_heads: int
    head_dim: int
    layers: int
    image_size: int  # the longest side an image is resized to fit
    patch_size: int = 14
    spatial_merge_size: int = 2
    hidden_act: str = "silu"
    rope_theta: float = 10000.0
    # the tokens after each row of an image's positions ([IMG_BREAK]) and after its last
    # ([IMG_END]): their embeddings are rows of the image's span (mistral3)
    break_token_id: int = 12
    end_token_id: int = 13
    projector_bias: bool = False  # the projector's linear layers have biases
    # Mistral 3's projector norms the rows and merges spatial_merge_size^2 of them into one;
    # Pixtral 12B's (LLaVA's) has neither (spatial_merge_size 1)
    patch_merger: bool = True

    @property
    def unit(self) -> int:
        """An image's sides are multiples of this many pixels: one merged position."""
        return self.patch_size * self.spatial_merge_size

    @classmethod
    def from_hf(cls, cfg: Mapping[str, Any], merge: int) -> PixtralViTConfig:
        """The tower a Mistral 3 `vision_config` describes (what it leaves out is Mistral
        Small 3.1's), with the outer config's spatial_merge_size; the row tokens are Mistral's
        vocabulary's until the folder's tokenizer says (loader.with_processor)."""
        rope = cfg.get("rope_parameters") or {}
        hidden, heads = int(cfg.get("hidden_size", 1024)), int(cfg.get("num_attention_heads", 16))
        return cls(hidden_size=hidden,
                   intermediate_size=int(cfg.get("intermediate_size", 4096)),
                   num_heads=heads, head_dim=int(cfg.get("head_dim") or hidden // heads),
                   layers=int(cfg.get("num_hidden_layers", 24)),
                   image_size=int(cfg.get("image_size", 1540)),
                   patch_size=int(cfg.get("patch_size", 14)), spatial_merge_size=merge,
                   hidden_act=str(cfg.get("hidden_act", "silu")),
                   rope_theta=float(rope.get("rope_theta") or cfg.get("rope_theta", 10000.0)))


@dataclass(frozen=True, slots=True)
class VisionConfig:
    """A vision model's image side: its tower, and the prompt's image placeholder."""

    tower: TowerConfig | QwenViTConfig | PixtralViTConfig
    image_token_id: int  # the placeholder token each image's positions hold
    # positions one image takes in the prompt; a tiled image: one tile's (each tile is one
    # encoder input, placed by the prompt text the family writes for it); 0: each image
    # its own, from its size (Qwen2.5-VL's patches)
    tokens_per_image: int
    placeholder: str  # the text a chat message holds where an image goes
    # how an image becomes pixel values: one resized image, tiles (SmolVLM's splitting),
    # patches at about the image's own size (Qwen2.5-VL's), or the whole picture and tiles at
    # the resolution that fits it (LLaVA-NeXT's)
    processor: ProcessorConfig | TilingConfig | PatchConfig | AnyresConfig | FitConfig
    # the processor's text for one image, put where the chat template wrote `placeholder`
    # (Gemma 3's: its image tokens between its own tags), the image token once (repeated to
    # tokens_per_image after encoding); the template then gets image parts as they are
    # (`{"type": "image"}`). None: the placeholder is the image token itself.
    image_text: str | None = None
    # an image's positions attend to one another both ways (Gemma 3), not causally
    whole_images: bool = False
    # the text model's vocabulary has no token for `placeholder` (a LLaVA GGUF converted from
    # the original checkpoint): the prompt is encoded in pieces around each placeholder, each
    # image's positions holding `image_token_id` (whatever it spells: those positions take
    # the image's rows), as llama.cpp tokenizes the text around its media markers
    split_at_placeholder: bool = False

    @property
    def vit(self) -> TowerConfig:
        """The tower, for the families built on a CLIP or SigLIP ViT."""
        if not isinstance(self.tower, TowerConfig):
            raise TypeError(f"{type(self.tower).__name__} is not a CLIP or SigLIP tower")
        return self.tower

    @property
    def layers(self) -> int:
        """The tower's layers an image runs through (its encoder steps, see encoder_steps)."""
        return self.tower.depth if isinstance(self.tower, QwenViTConfig) else self.tower.layers


def with_vision(text: ModelConfig, model_type: str, vision: VisionConfig,
                cfg: Mapping[str, Any]) -> ModelConfig:
    """A vision family's config: its text model's `text`, with the image side, and the
    outer config's tie_word_embeddings where it says (it may differ from text_config's)."""
    return replace(text, model_type=model_type, vision=vision,
                   tie_word_embeddings=bool(cfg.get("tie_word_embeddings",
                                                    text.tie_word_embeddings)))


def renamed(key: str, renames: tuple[tuple[str, str], ...]) -> str:
    """A checkpoint key under this model's module names: the first of `renames` (old prefix,
    new prefix) that it starts with, swapped; else the key as it is."""
    for old, new in renames:
        if key.startswith(old):
            return new + key[len(old):]
    return key
