"""A vision model's tower and projector written as llama.cpp's projector file (`mmproj`,
architecture `clip`), by the names and metadata keys of llama.cpp's converter (gguf-py's
constants), for the tests that run without a llama.cpp checkout: Gemma 3's (`gemma3`
projector); and synthetic ones of random weights at real sizes (Gemma 3's, Qwen2.5-VL's
`qwen2.5vl_merger`) for benchmarks. `swap_ffn` writes each FFN's up and down under each
other's name, as older projector files have them."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np

LAYER = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.out_proj": "attn_out",
         "layer_norm1": "ln1", "layer_norm2": "ln2", "mlp.fc1": "ffn_up", "mlp.fc2": "ffn_down"}
TOP = {"embeddings.patch_embedding": "v.patch_embd",
       "embeddings.position_embedding": "v.position_embd", "post_layernorm": "v.post_ln"}


def clip_writer(path: Path, kind: str, vision: Any, width: int, layers: int,
                mean: tuple[float, float, float], std: tuple[float, float, float],
                gelu: bool) -> gguf.GGUFWriter:
    """A projector file's writer at `path` with the metadata of a `kind` projector over the
    tower `vision` (transformers' vision config), `layers` of it written."""
    w = gguf.GGUFWriter(str(path), "clip")
    w.add_bool(gguf.Keys.Clip.HAS_VISION_ENCODER, True)
    w.add_string(gguf.Keys.Clip.PROJECTOR_TYPE, kind)
    v = gguf.Keys.ClipVision
    w.add_uint32(v.PROJECTION_DIM, width)
    w.add_uint32(v.IMAGE_SIZE, vision.image_size)
    w.add_uint32(v.PATCH_SIZE, vision.patch_size)
    w.add_uint32(v.EMBEDDING_LENGTH, vision.hidden_size)
    w.add_uint32(v.FEED_FORWARD_LENGTH, vision.intermediate_size)
    w.add_uint32(v.BLOCK_COUNT, layers)
    w.add_uint32(v.Attention.HEAD_COUNT, vision.num_attention_heads)
    w.add_float32(v.Attention.LAYERNORM_EPS, vision.layer_norm_eps)
    w.add_array(v.IMAGE_MEAN, list(mean))
    w.add_array(v.IMAGE_STD, list(std))
    w.add_bool(v.USE_GELU, gelu)
    return w


def write_gemma3_mmproj(path: Path, hf: Any, tokens_per_image: int,
                        swap_ffn: bool = False, half: bool = False) -> None:
    """`hf` (transformers' Gemma3ForConditionalGeneration) -> its projector file at `path`,
    the tower layers' matrices in F16 where `half` (as llama.cpp's converter writes them
    by default), else everything in F32."""
    cfg, vision = hf.config, hf.config.vision_config
    w = clip_writer(path, "gemma3", vision, cfg.text_config.hidden_size,
                    vision.num_hidden_layers, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), True)
    v = gguf.Keys.ClipVision
    scale = (vision.image_size // vision.patch_size) // round(tokens_per_image ** 0.5)
    if scale != 4:  # as the converter: only where it is not Gemma 3's
        w.add_uint32(v.Projector.SCALE_FACTOR, scale)
    swap = {"ffn_up": "ffn_down", "ffn_down": "ffn_up"} if swap_ffn else {}
    for key, value in hf.state_dict().items():
        data = value.detach().float().numpy()
        if ".vision_tower." in f".{key}" and ".head." not in key:
            rest = key.split("vision_tower.", 1)[1].removeprefix("vision_model.")
            base, _, kind = rest.rpartition(".")
            if base.startswith("encoder.layers."):
                _, _, i, module = base.split(".", 3)
                short = LAYER[module]
                name = f"v.blk.{i}.{swap.get(short, short)}.{kind}"
                if half and data.ndim == 2:
                    data = data.astype(np.float16)
            else:
                name = f"{TOP[base]}.{kind}"
            w.add_tensor(name, data)
        elif key.endswith("mm_input_projection_weight"):
            w.add_tensor("mm.input_projection.weight", data)
        elif key.endswith("mm_soft_emb_norm.weight"):  # llama.cpp stores Gemma's 1 + w
            w.add_tensor("mm.soft_emb_norm.weight", (data + 1).astype(np.float32))
    finish(w)


# llama.cpp's legacy LLaVA script's names (tools/mtmd/legacy-models/
# convert_image_encoder_to_gguf.py): CLIP's fc1 under ffn_down and fc2 under ffn_up
LEGACY_LAYER = {**LAYER, "mlp.fc1": "ffn_down", "mlp.fc2": "ffn_up"}
LEGACY_TOP = {"embeddings.patch_embedding": "v.patch_embd",
              "embeddings.position_embedding": "v.position_embd", "pre_layrnorm": "v.pre_ln"}


def write_llava_mmproj(path: Path, hf: Any, layers: int | None = None) -> None:
    """`hf` (transformers' LlavaForConditionalGeneration) -> its projector file at `path`, as
    llama.cpp's legacy script writes LLaVA 1.5's (`--llava-projector`, type `mlp`): the tower
    cut to its first `layers` (default: all but the last), no post-layernorm, F16 matrices
    and patch kernel, CLIP's default mean and std. A LlavaNextForConditionalGeneration's
    (LLaVA 1.6) adds its pinpoints and image_newline, as that script does."""
    vision = hf.config.vision_config
    used = vision.num_hidden_layers - 1 if layers is None else layers
    w = clip_writer(path, "mlp", vision, vision.projection_dim, used,
                    (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711),
                    vision.hidden_act == "gelu")
    w.add_bool("clip.has_llava_projector", True)
    grid = getattr(hf.config, "image_grid_pinpoints", None)
    if grid is not None:  # LLaVA 1.6: flat, width then height, as llama.cpp reads them
        w.add_array("clip.vision.image_grid_pinpoints", [v for h, wd in grid for v in (wd, h)])
        w.add_string("clip.vision.mm_patch_merge_type", "spatial_unpad")
        w.add_uint32("clip.vision.image_crop_resolution", vision.image_size)
    for key, value in hf.state_dict().items():
        data = value.detach().float().numpy()
        half = data.astype(np.float16) if data.ndim in (2, 4) else data
        if key.endswith("image_newline"):
            w.add_tensor("model.image_newline", data)
        elif "multi_modal_projector." in key:
            base, _, kind = key.split("multi_modal_projector.", 1)[1].rpartition(".")
            w.add_tensor(f"mm.{'0' if base == 'linear_1' else '2'}.{kind}", half)
        elif "vision_tower." in key:
            rest = key.split("vision_tower.", 1)[1].removeprefix("vision_model.")
            base, _, kind = rest.rpartition(".")
            if base.startswith("encoder.layers."):
                _, _, i, module = base.split(".", 3)
                if int(i) < used:
                    w.add_tensor(f"v.blk.{i}.{LEGACY_LAYER[module]}.{kind}", half)
            elif base == "embeddings" and kind == "class_embedding":
                w.add_tensor("v.class_embd", data)
            elif base in LEGACY_TOP:
                w.add_tensor(f"{LEGACY_TOP[base]}.{kind}", half)
    finish(w)


# Mistral 3's Pixtral tower and projector: HF key (after its prefix) -> GGUF name
PIXTRAL_LAYER = {"attention.q_proj": "attn_q", "attention.k_proj": "attn_k",
                 "attention.v_proj": "attn_v", "attention.o_proj": "attn_out",
                 "attention_norm": "ln1", "ffn_norm": "ln2", "feed_forward.gate_proj": "ffn_gate",
                 "feed_forward.up_proj": "ffn_up", "feed_forward.down_proj": "ffn_down"}
PIXTRAL_TOP = {"vision_tower.patch_conv": "v.patch_embd", "vision_tower.ln_pre": "v.pre_ln",
               "multi_modal_projector.norm": "mm.input_norm",
               "multi_modal_projector.patch_merger.merging_layer": "mm.patch_merger",
               "multi_modal_projector.linear_1": "mm.1",
               "multi_modal_projector.linear_2": "mm.2"}


def write_mistral3_mmproj(path: Path, hf: Any, break_token: int) -> None:
    """`hf` (transformers' Mistral3ForConditionalGeneration, or a Pixtral 12B's
    LlavaForConditionalGeneration) -> its projector file at `path`,
    as llama.cpp's converter writes it (`--mmproj`, type `pixtral`): the tower's q and k rows
    in its rotary order (LlamaModel.permute), F16 matrices and patch kernel, SiLU, the merge
    size, and the `[IMG_BREAK]` row of the text model's embeddings."""
    from types import SimpleNamespace

    from tests.tools.hf_gguf import llama_cpp_permute

    cfg, vision = hf.config, hf.config.vision_config
    shape = SimpleNamespace(image_size=vision.image_size, patch_size=vision.patch_size,
                            hidden_size=vision.hidden_size,
                            intermediate_size=vision.intermediate_size,
                            num_attention_heads=vision.num_attention_heads, layer_norm_eps=1e-5)
    w = clip_writer(path, "pixtral", shape, cfg.text_config.hidden_size,
                    vision.num_hidden_layers, (0.48145466, 0.4578275, 0.40821073),
                    (0.26862954, 0.26130258, 0.27577711), False)
    w.add_bool(gguf.Keys.ClipVision.USE_SILU, vision.hidden_act == "silu")
    if getattr(cfg, "spatial_merge_size", None):  # Pixtral 12B's LLaVA config has none
        w.add_uint32(gguf.Keys.ClipVision.SPATIAL_MERGE_SIZE, cfg.spatial_merge_size)
    for key, value in hf.state_dict().items():
        key = key.removeprefix("model.")
        base, _, kind = key.rpartition(".")
        data = value.detach().float()
        if base.startswith("vision_tower.transformer.layers."):
            i, module = base.split(".", 4)[3:]
            short = PIXTRAL_LAYER[module]
            if short in ("attn_q", "attn_k"):
                data = llama_cpp_permute(data, vision.num_attention_heads)
            name = f"v.blk.{i}.{short}.{kind}"
        elif base in PIXTRAL_TOP:
            name = f"{PIXTRAL_TOP[base]}.{kind}"
        elif base == "language_model.embed_tokens":
            w.add_tensor("v.token_embd.img_break", data[break_token].numpy())
            continue
        else:
            continue
        array = data.numpy()
        w.add_tensor(name, array.astype(np.float16) if array.ndim in (2, 4) else array)
    finish(w)


def finish(w: gguf.GGUFWriter) -> None:
    """Write the header, metadata and tensors a writer holds, and close the file."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


class RandomTensors:
    """Random tensors written into a projector file as llama.cpp's converter types them (F16
    matrices where `half`, F32 vectors and embeddings), their parameters counted."""

    def __init__(self, writer: gguf.GGUFWriter, rng: np.random.Generator) -> None:
        self.writer, self.rng, self.total = writer, rng, 0

    def add(self, name: str, shape: tuple[int, ...], half: bool, ones: bool = False) -> None:
        data = np.ones(shape, np.float32) if ones else \
            self.rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
        self.writer.add_tensor(name, data.astype(np.float16) if half else data)
        self.total += data.size


CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def synthetic_writer(path: Path, kind: str, width: int, image_size: int, patch: int,
                     hidden: int, ff: int, layers: int, heads: int, eps: float,
                     mean: tuple[float, ...] = CLIP_MEAN, std: tuple[float, ...] = CLIP_STD,
                     seed: int = 0, ints: tuple[tuple[str, int], ...] = ()
                     ) -> tuple[gguf.GGUFWriter, RandomTensors]:
    """A synthetic projector file's writer at `path` with the metadata every `kind`
    projector has (its rows `width` wide; `ints`: more of its integer keys), and the random
    tensors to fill it from `seed`."""
    w = gguf.GGUFWriter(str(path), "clip")
    w.add_bool(gguf.Keys.Clip.HAS_VISION_ENCODER, True)
    w.add_string(gguf.Keys.Clip.PROJECTOR_TYPE, kind)
    v = gguf.Keys.ClipVision
    for key, value in ((v.PROJECTION_DIM, width), (v.IMAGE_SIZE, image_size),
                       (v.PATCH_SIZE, patch), (v.EMBEDDING_LENGTH, hidden),
                       (v.FEED_FORWARD_LENGTH, ff), (v.BLOCK_COUNT, layers),
                       (v.Attention.HEAD_COUNT, heads), *ints):
        w.add_uint32(key, value)
    w.add_float32(v.Attention.LAYERNORM_EPS, eps)
    w.add_array(v.IMAGE_MEAN, list(mean))
    w.add_array(v.IMAGE_STD, list(std))
    return w, RandomTensors(w, np.random.default_rng(seed))


def write_synthetic_gemma3_mmproj(path: Path, text_hidden: int, hidden: int = 1152,
                                  ff: int = 4304, layers: int = 27, heads: int = 16,
                                  image_size: int = 896, patch: int = 14,
                                  seed: int = 0) -> int:
    """A Gemma 3 projector file of random weights (SigLIP so400m's shape by default: Gemma 3
    4B-27B's tower), F16 matrices as llama.cpp's converter writes them (F32 embeddings and
    vectors), for speed and memory figures beside a synthetic text GGUF. Returns the
    parameter count."""
    w, tensors = synthetic_writer(path, "gemma3", text_hidden, image_size, patch, hidden, ff,
                                  layers, heads, 1e-6, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), seed)
    w.add_bool(gguf.Keys.ClipVision.USE_GELU, True)
    add = tensors.add

    patches = (image_size // patch) ** 2
    add("v.patch_embd.weight", (hidden, 3, patch, patch), False)
    add("v.patch_embd.bias", (hidden,), False)
    add("v.position_embd.weight", (patches, hidden), False)
    for i in range(layers):
        for name, shape in (("attn_q", (hidden, hidden)), ("attn_k", (hidden, hidden)),
                            ("attn_v", (hidden, hidden)), ("attn_out", (hidden, hidden)),
                            ("ffn_up", (ff, hidden)), ("ffn_down", (hidden, ff))):
            add(f"v.blk.{i}.{name}.weight", shape, True)
            add(f"v.blk.{i}.{name}.bias", (shape[0],), False)
        for norm in ("ln1", "ln2"):
            add(f"v.blk.{i}.{norm}.weight", (hidden,), False, ones=True)
            add(f"v.blk.{i}.{norm}.bias", (hidden,), False)
    add("v.post_ln.weight", (hidden,), False, ones=True)
    add("v.post_ln.bias", (hidden,), False)
    add("mm.input_projection.weight", (hidden, text_hidden), True)
    add("mm.soft_emb_norm.weight", (hidden,), False, ones=True)
    finish(w)
    return tensors.total


def write_synthetic_qwen25vl_mmproj(path: Path, text_hidden: int, hidden: int = 1280,
                                    ff: int = 3420, layers: int = 32, heads: int = 16,
                                    patch: int = 14, full_every: int = 8,
                                    seed: int = 0) -> int:
    """A Qwen2.5-VL projector file of random weights (its 3B-72B tower's shape by default),
    as llama.cpp's converter writes it: q, k, v apart, the Conv3d patch embedding as one
    kernel per frame, F16 matrices, F32 vectors. Returns the parameter count."""
    w, tensors = synthetic_writer(path, "qwen2.5vl_merger", text_hidden, 560, patch, hidden,
                                  ff, layers, heads, 1e-6, seed=seed,
                                  ints=(("clip.vision.n_wa_pattern", full_every),))
    w.add_bool("clip.use_silu", True)
    add = tensors.add

    add("v.patch_embd.weight", (hidden, 3, patch, patch), True)
    add("v.patch_embd.weight.1", (hidden, 3, patch, patch), True)
    for i in range(layers):
        for name, shape in (("attn_q", (hidden, hidden)), ("attn_k", (hidden, hidden)),
                            ("attn_v", (hidden, hidden)), ("attn_out", (hidden, hidden)),
                            ("ffn_gate", (ff, hidden)), ("ffn_up", (ff, hidden)),
                            ("ffn_down", (hidden, ff))):
            add(f"v.blk.{i}.{name}.weight", shape, True)
            add(f"v.blk.{i}.{name}.bias", (shape[0],), False)
        for norm in ("ln1", "ln2"):
            add(f"v.blk.{i}.{norm}.weight", (hidden,), False, ones=True)
    add("v.post_ln.weight", (hidden,), False, ones=True)
    add("mm.0.weight", (4 * hidden, 4 * hidden), True)
    add("mm.0.bias", (4 * hidden,), False)
    add("mm.2.weight", (text_hidden, 4 * hidden), True)
    add("mm.2.bias", (text_hidden,), False)
    finish(w)
    return tensors.total


def write_synthetic_llava_next_mmproj(path: Path, text_hidden: int, hidden: int = 1024,
                                      ff: int = 4096, layers: int = 23, heads: int = 16,
                                      image_size: int = 336, patch: int = 14,
                                      seed: int = 0) -> int:
    """A LLaVA 1.6 projector file of random weights (CLIP ViT-L/14 at 336 pixels, its last
    layer dropped, LLaVA 1.6's pinpoints), as llama.cpp's legacy script writes it: an `mlp`
    projector, F16 matrices, F32 vectors and embeddings; the newline under the name
    llama.cpp's server reads (`v.image_newline`). Returns the parameter count."""
    w, tensors = synthetic_writer(path, "mlp", 768, image_size, patch, hidden, ff, layers,
                                  heads, 1e-5, seed=seed,
                                  ints=(("clip.vision.image_crop_resolution", image_size),))
    w.add_bool("clip.has_llava_projector", True)
    w.add_bool(gguf.Keys.ClipVision.USE_GELU, False)
    w.add_array("clip.vision.image_grid_pinpoints",
                [336, 672, 672, 336, 672, 672, 1008, 336, 336, 1008])
    w.add_string("clip.vision.mm_patch_merge_type", "spatial_unpad")
    add = tensors.add

    add("v.patch_embd.weight", (hidden, 3, patch, patch), True)
    add("v.class_embd", (hidden,), False)
    add("v.position_embd.weight", ((image_size // patch) ** 2 + 1, hidden), False)
    add("v.pre_ln.weight", (hidden,), False, ones=True)
    add("v.pre_ln.bias", (hidden,), False)
    for i in range(layers):
        for name, shape in (("attn_q", (hidden, hidden)), ("attn_k", (hidden, hidden)),
                            ("attn_v", (hidden, hidden)), ("attn_out", (hidden, hidden)),
                            ("ffn_down", (ff, hidden)), ("ffn_up", (hidden, ff))):
            add(f"v.blk.{i}.{name}.weight", shape, True)  # the legacy names: fc1 as down
            add(f"v.blk.{i}.{name}.bias", (shape[0],), False)
        for norm in ("ln1", "ln2"):
            add(f"v.blk.{i}.{norm}.weight", (hidden,), False, ones=True)
            add(f"v.blk.{i}.{norm}.bias", (hidden,), False)
    add("mm.0.weight", (text_hidden, hidden), True)
    add("mm.0.bias", (text_hidden,), False)
    add("mm.2.weight", (text_hidden, text_hidden), True)
    add("mm.2.bias", (text_hidden,), False)
    add("v.image_newline", (text_hidden,), False)
    finish(w)
    return tensors.total


def write_synthetic_mistral3_mmproj(path: Path, text_hidden: int, hidden: int = 1024,
                                    ff: int = 4096, layers: int = 24, heads: int = 16,
                                    image_size: int = 1540, patch: int = 14,
                                    seed: int = 0) -> int:
    """A Mistral 3 projector file of random weights (Mistral Small 3.1's Pixtral tower and
    patch merger), as llama.cpp's converter writes it: a `pixtral` projector, SiLU, F16
    matrices, F32 vectors, the [IMG_BREAK] row. Returns the parameter count."""
    w, tensors = synthetic_writer(path, "pixtral", text_hidden, image_size, patch, hidden, ff,
                                  layers, heads, 1e-5, seed=seed,
                                  ints=((gguf.Keys.ClipVision.SPATIAL_MERGE_SIZE, 2),))
    w.add_bool(gguf.Keys.ClipVision.USE_SILU, True)
    add = tensors.add
    add("v.patch_embd.weight", (hidden, 3, patch, patch), True)
    add("v.pre_ln.weight", (hidden,), False, ones=True)
    for i in range(layers):
        for name, shape in (("attn_q", (hidden, hidden)), ("attn_k", (hidden, hidden)),
                            ("attn_v", (hidden, hidden)), ("attn_out", (hidden, hidden)),
                            ("ffn_gate", (ff, hidden)), ("ffn_up", (ff, hidden)),
                            ("ffn_down", (hidden, ff))):
            add(f"v.blk.{i}.{name}.weight", shape, True)
        for norm in ("ln1", "ln2"):
            add(f"v.blk.{i}.{norm}.weight", (hidden,), False, ones=True)
    add("mm.input_norm.weight", (hidden,), False, ones=True)
    add("mm.patch_merger.weight", (hidden, 4 * hidden), True)
    add("mm.1.weight", (text_hidden, hidden), True)
    add("mm.2.weight", (text_hidden, text_hidden), True)
    add("v.token_embd.img_break", (text_hidden,), False)
    finish(w)
    return tensors.total


SYNTHETIC = {"gemma3": write_synthetic_gemma3_mmproj,
             "qwen2.5vl_merger": write_synthetic_qwen25vl_mmproj,
             "llava_next": write_synthetic_llava_next_mmproj,
             "pixtral": write_synthetic_mistral3_mmproj}


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Write a synthetic projector file of random "
                                                 "weights at a real tower's shape.")
    parser.add_argument("out", type=Path)
    parser.add_argument("--text-hidden", type=int, required=True,
                        help="the text model's width (2560 for Gemma 3 4B, 2048 for "
                             "Qwen2.5-VL 3B, 4096 for LLaVA 1.6 7B, 5120 for Mistral Small "
                             "3.1)")
    parser.add_argument("--type", default="gemma3", choices=list(SYNTHETIC))
    args = parser.parse_args()
    total = SYNTHETIC[args.type](args.out, args.text_hidden)
    print(f"{args.out}: {args.type} projector, {total / 1e6:.1f}M parameters")


if __name__ == "__main__":
    main()
