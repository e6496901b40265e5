"""The decoder every architecture shares: embeddings, a stack of layers, final norm, LM head.

The forward pass is a function of explicit inputs: token ids [T], positions [T], an attention
backend already prepared for the round (it holds the KV pool and the round's index tensors),
the rows whose logits are wanted and, for decode rounds, the fused native layers the executor
built (fused_decode). No padding, no hidden cache state in the modules. Parameter names follow
the Hugging Face checkpoint keys, except the fused projections (`qkv_proj`, `gate_up_proj`)
whose pieces an architecture maps by `packed_modules`.

An architecture (one file each, listed in registry.py) subclasses CausalLM: it reads its
config.json and GGUF metadata into a ModelConfig, names its GGUF tensors, and builds its
layers from the shared ones (`make_layer`; the pre-norm DecoderLayer below by default).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from engine.execution.attention.base import AttentionBackend
from engine.execution.model import linear_kernels
from engine.execution.model.config import ModelConfig, RopeSpec
from engine.execution.model.encoder_steps import EncoderSteps, run_through
from engine.execution.model.layers import (
    Attention,
    Embedding,
    GatedMLP,
    Linear,
    PackedLinear,
    RMSNorm,
    RotaryEmbedding,
)

if TYPE_CHECKING:
    from engine.execution.loading.projector_gguf import ProjectorFile, ProjectorTensor
    from engine.execution.model.config import GGUFMeta
    from engine.execution.model.fused_decode import DecodeLayerSpec, FusedDecode

Tables = list[tuple[torch.Tensor, torch.Tensor]]  # (cos, sin) per distinct rope of the model

# GGUF names shared by the Llama-like architectures (per layer: without "blk.N.")
GGUF_GLOBAL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
               "output": "lm_head"}
GGUF_LAYER = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
PACKED = {"q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"),
          "v_proj": ("qkv_proj", "v"), "gate_proj": ("gate_up_proj", "gate"),
          "up_proj": ("gate_up_proj", "up")}


class DecoderLayer(nn.Module):
    """Pre-norm: x + attn(norm(x)), then + mlp(norm(...))."""

    def __init__(self, cfg: ModelConfig, layer: int, dtype: torch.dtype,
                 device: torch.device | str | None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.self_attn = Attention(cfg, layer, dtype, device)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.mlp: nn.Module = GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act,
                                       cfg.mlp_bias, dtype, device)

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

    def decode_spec(self, rope: int) -> DecodeLayerSpec | None:
        """This layer as the fused native decoder runs it (None: it cannot)."""
        from engine.execution.model.fused_decode import describe_layer

        return describe_layer(self.self_attn, self.mlp,
                              (self.input_layernorm, self.post_attention_layernorm), rope)


class DecoderModel(nn.Module):
    rotary: nn.ModuleList  # one RotaryEmbedding per distinct rope (CausalLM.build_rotary)

    def __init__(self, layers: list[nn.Module], cfg: ModelConfig, dtype: torch.dtype,
                 device: torch.device | str | None) -> None:
        super().__init__()
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size, dtype, device)
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)


class CausalLM(nn.Module):
    hf_model_types: ClassVar[tuple[str, ...]] = ()  # config.json model_type values
    gguf_archs: ClassVar[tuple[str, ...]] = ()  # GGUF general.architecture values
    # checkpoint module name -> (our fused module, shard)
    packed_modules: ClassVar[Mapping[str, tuple[str, str]]] = PACKED
    gguf_global_names: ClassVar[Mapping[str, str]] = GGUF_GLOBAL
    gguf_layer_names: ClassVar[Mapping[str, str]] = GGUF_LAYER
    gguf_permute_qk: ClassVar[bool] = False  # llama.cpp permutes attn_q / attn_k rows
    # 3-D per-layer GGUF tensors of all experts -> per-expert HF module name ("{e}")
    gguf_expert_names: ClassVar[Mapping[str, str]] = {}
    # GGUF tensors that config_from_gguf reads (GGUFMeta.floats), not weights
    gguf_config_tensors: ClassVar[tuple[str, ...]] = ()
    # a vision family read from a text GGUF and llama.cpp's projector file
    # (loading.projector_gguf): its clip.projector_type, the text architectures it goes
    # over, its tower's module name, and the projector's GGUF tensor names -> keys
    projector_type: ClassVar[str] = ""
    projector_text_archs: ClassVar[tuple[str, ...]] = ()
    projector_tower: ClassVar[str] = "vision_tower"
    projector_names: ClassVar[Mapping[str, str]] = {}

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.config = cfg
        self.dtype = dtype
        layers = [self.make_layer(cfg, i, dtype, device) for i in range(cfg.num_layers)]
        self.model = DecoderModel(layers, cfg, dtype, device)
        if cfg.tie_word_embeddings:
            self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, False, dtype, "meta")
            self.lm_head.weight = self.model.embed_tokens.weight  # shared storage
        else:
            self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, False, dtype, device)
        self.ropes: list[RopeSpec] = []  # distinct ropes; layer i uses ropes[rope_index[i]]
        for spec in cfg.layers:
            if spec.rope not in self.ropes:
                self.ropes.append(spec.rope)
        self.rope_index = [self.ropes.index(spec.rope) for spec in cfg.layers]
        self.build_rotary(device)
        self.eos_ids: frozenset[int] = frozenset()  # a GGUF's metadata sets them

    # --- what an architecture file provides -------------------------------------------------

    @classmethod
    def config_from_hf(cls, cfg: Mapping[str, Any]) -> ModelConfig:
        raise NotImplementedError

    @classmethod
    def config_from_gguf(cls, meta: GGUFMeta) -> ModelConfig:
        raise NotImplementedError

    @classmethod
    def projector_tensors(cls, projector: ProjectorFile,
                          config: ModelConfig) -> dict[str, ProjectorTensor]:
        """The projector file's tensors under this model's keys: the tower's by llama.cpp's
        common names, the projector's by `projector_names`."""
        assert config.vision is not None
        return projector.keyed(cls.projector_tower, dict(cls.projector_names),
                               config.vision.tower.hidden_size)

    @classmethod
    def projector_width(cls, projector: ProjectorFile) -> int | None:
        """The width of the rows the projector file gives (None: it does not say)."""
        width = projector.meta.get("clip.vision.projection_dim")
        return None if width is None else int(width)

    @classmethod
    def config_from_projector(cls, text: ModelConfig, projector: ProjectorFile,
                              token_id: Callable[[str], int | None]) -> ModelConfig:
        """A vision family's config: the text GGUF's `text`, with the image side the
        projector file describes; `token_id` looks up the text file's vocabulary."""
        raise NotImplementedError

    def make_layer(self, cfg: ModelConfig, layer: int, dtype: torch.dtype,
                   device: torch.device | str | None) -> nn.Module:
        return DecoderLayer(cfg, layer, dtype, device)

    @classmethod
    def hf_key(cls, key: str) -> str:
        """A checkpoint key as this model's modules name it (a vision family's text model
        sits under `language_model` in its checkpoint)."""
        return key

    @property
    def takes_images(self) -> bool:
        return self.config.vision is not None

    def encode_images(self, pixels: torch.Tensor, grid: tuple[int, int] | None = None,
                      size: tuple[int, int] | None = None) -> torch.Tensor:
        """Pixel values [B, 3, H, W] -> the rows each image's positions hold
        [B, tokens_per_image, hidden] (vision families only); `grid`: the images' (rows,
        cols) of positions, where the family lays them out in two dimensions (M-RoPE);
        `size`: the images' (height, width) as sent, where their rows depend on it
        (LLaVA-NeXT's tiles, [B, tiles, 3, H, W])."""
        return run_through(self.encode_steps(pixels, grid, size))

    def encode_steps(self, pixels: torch.Tensor, grid: tuple[int, int] | None = None,
                     size: tuple[int, int] | None = None) -> EncoderSteps:
        """`encode_images` as steps, a yield after each of the tower's layers."""
        raise NotImplementedError(f"{self.config.model_type} takes no images")

    def adapt_hf_tensor(self, key: str, tensor: torch.Tensor) -> torch.Tensor:
        """A safetensors tensor in the convention the layers use (e.g. Gemma's norms)."""
        return tensor

    def skip_key(self, key: str) -> bool:
        """Checkpoint tensors that have no place in the model and are not an error."""
        return "rotary_emb" in key or (key == "lm_head.weight"
                                        and self.config.tie_word_embeddings)

    def decode_layers(self) -> list[DecodeLayerSpec] | None:
        """The layers as the fused native decoder takes them (each layer's `decode_spec`),
        or None where it cannot run one of them."""
        specs = []
        for layer, rope in zip(self.model.layers, self.rope_index, strict=True):
            describe = getattr(layer, "decode_spec", None)
            spec = describe(rope) if describe is not None else None
            if spec is None:
                return None
            specs.append(spec)
        return specs

    # --- shared -----------------------------------------------------------------------------

    def build_rotary(self, device: torch.device | str | None,
                     factors: torch.Tensor | None = None) -> None:
        """The rotary modules on `device` (the model may have been built on meta), with
        llama.cpp's per-frequency factors where a GGUF has them (rope_freqs)."""
        cfg = self.config
        self.model.rotary = nn.ModuleList(
            RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, spec, device, factors)
            for spec in self.ropes)

    def checkpoint_keys(self) -> dict[tuple[str, str], list[str]]:
        """(module, parameter) -> the checkpoint tensors that fill it, in row order: one,
        or the pieces of a fused projection. A tied LM head is left out."""
        unpack: dict[str, list[str]] = {}
        for src, (dst, _) in self.packed_modules.items():
            unpack.setdefault(dst, []).append(src)
        out: dict[tuple[str, str], list[str]] = {}
        for name, module in self.named_modules():
            if name == "lm_head" and self.config.tie_word_embeddings:
                continue
            for attr, p in module.named_parameters(recurse=False):
                if p is None:
                    continue
                prefix, _, last = name.rpartition(".")
                if isinstance(module, PackedLinear) and last in unpack:
                    by_shard = {self.packed_modules[s][1]: s for s in unpack[last]}
                    out[(name, attr)] = [f"{prefix}.{by_shard[s]}.{attr}" for s in module.shards]
                else:  # one of the model's own (LLaVA-NeXT's image_newline): no module
                    out[(name, attr)] = [f"{name}.{attr}" if name else attr]
        return out

    def checkpoint_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every checkpoint tensor's shape, as the config implies."""
        shapes: dict[str, tuple[int, ...]] = {}
        for (name, attr), keys in self.checkpoint_keys().items():
            module = self.get_submodule(name)
            shape = tuple(getattr(module, attr).shape)
            if len(keys) == 1:
                shapes[keys[0]] = shape
                continue
            assert isinstance(module, PackedLinear)
            for key, rows in zip(keys, module.shard_sizes):
                shapes[key] = (rows, *shape[1:])
        return shapes

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

    @property
    def quantized(self) -> bool:
        """Some projection multiplies block-quantized weights on the host (activations stay
        float32)."""
        return any(linear_kernels.on_host_blocks(m.weight) for m in self.modules()
                   if isinstance(m, Linear))

    @property
    def device_quantized(self) -> bool:
        """Some projection multiplies a GGUF's blocks kept on the device (gpu_quant; the
        activations in the model's dtype)."""
        return any(linear_kernels.is_quantized(m.weight)
                   and not linear_kernels.on_host_blocks(m.weight)
                   for m in self.modules() if isinstance(m, Linear))

    def weight_types(self) -> tuple[dict[str, int], str, int]:
        """(bytes per weight type over the decoder layers' projections, the LM head's type,
        bytes of all weights, a tied head counted once) for describing how the model runs."""
        from engine.kernels import quant

        def kinds(w: linear_kernels.Weight) -> list[tuple[str, int]]:
            """(type, bytes) of a weight, per part of a SplitWeight or a device weight."""
            if isinstance(w, torch.Tensor):
                return [(str(w.dtype).removeprefix("torch."), w.numel() * w.element_size())]
            parts = (w,) if isinstance(w, quant.QuantWeight) else w.parts
            return [(quant.type_name(p.qtype), int(p.nbytes)) for p in parts]

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
                logits_indices: torch.Tensor | None = None,
                fused: FusedDecode | None = None,
                image_rows: torch.Tensor | None = None,
                image_embeds: torch.Tensor | None = None) -> torch.Tensor:
        """[T] ids and positions -> logits [S, vocab] for rows `logits_indices` (all if None).

        `attn` must be prepared for this round. Rows `image_rows` take `image_embeds`
        (the encoder's output for the image positions) instead of their token's embedding.
        The final norm and the LM head run only on the selected rows: prefill chunks that
        do not sample cost no vocab projection.
        """
        cfg = self.config
        x = self.model.embed_tokens(input_ids)
        if cfg.embed_scale is not None:
            x = x * torch.tensor(cfg.embed_scale, dtype=x.dtype, device=x.device)
        if image_rows is not None and image_embeds is not None:
            x = x.index_copy(0, image_rows, image_embeds.to(x.dtype))
        tables: Tables = [rotary(positions, x.dtype) for rotary in self.model.rotary]
        residual: torch.Tensor | None = None
        done = fused.run(x, tables, attn) if fused is not None else None
        if done is not None:  # a decode round of a few sequences: one C call per layer
            x, residual = done
        else:
            for layer, rope in zip(self.model.layers, self.rope_index, strict=True):
                x, residual = layer(x, residual, *tables[rope], attn)
        if logits_indices is not None:
            x = x.index_select(0, logits_indices)
            residual = None if residual is None else residual.index_select(0, logits_indices)
        h = (self.model.norm(x) if residual is None
             else self.model.norm.add_and_norm(x, residual)[0])
        logits = vocab_projection(h, self.lm_head)
        if cfg.final_softcap:
            logits = torch.tanh(logits / cfg.final_softcap) * cfg.final_softcap
        return logits


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
