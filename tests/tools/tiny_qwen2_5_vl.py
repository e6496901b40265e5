"""A seeded random tiny Qwen2.5-VL (its vision transformer with window attention over 2 x 2
merged patches, a Qwen2 text model with M-RoPE) built by transformers offline, saved as a
Hugging Face folder with SmolLM2's tokenizer plus Qwen's vision tags, a Qwen-shaped chat
template and a Qwen2-VL image processor (patch 14, small max_pixels so images stay a few
dozen positions); and transformers' own greedy reply for a prompt with images, the
reference the vision tests hold Ferry to."""
from __future__ import annotations

import copy
import io
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from tests.tools.synthetic_gguf import QWEN2VL_TEMPLATE

# added after SmolLM2's 49152 tokens, in this order
SPECIAL = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>"]
VISION_START, VISION_END, IMAGE_TOKEN = 49152, 49153, 49154
MERGE = 2
MIN_PIXELS, MAX_PIXELS = 56 * 56, 28 * 28 * 48  # at most 48 positions an image
TEMPLATE = QWEN2VL_TEMPLATE  # image parts as <|vision_start|><|image_pad|><|vision_end|>


def build(folder: Path, tokenizer: Any, window: int = 56) -> Any:
    """Write the tiny Qwen2.5-VL into `folder` (SmolLM2's tokenizer, a copy: `tokenizer` is
    the session's); return transformers' model. `window`: its attention windows' side in
    pixels (56: 2 x 2 merged positions; llama.cpp's projector files leave it out, taking
    Qwen2.5-VL's 112)."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from tests.tools.random_hf import random_hf

    # head_dim 16: 8 rotary frequencies, split (time, row, column) 2 + 3 + 3
    text = dict(vocab_size=49160, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                 "mrope_section": [2, 3, 3]},
                initializer_range=0.2, bos_token_id=1, eos_token_id=2)
    # small windows, so an image spans several
    vision = dict(depth=4, hidden_size=32, intermediate_size=64, num_heads=4,
                  out_hidden_size=64, window_size=window, fullatt_block_indexes=[1, 3],
                  spatial_merge_size=MERGE, initializer_range=0.2)
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision,
                              image_token_id=IMAGE_TOKEN, video_token_id=49155,
                              vision_start_token_id=VISION_START,
                              vision_end_token_id=VISION_END, tie_word_embeddings=False)
    model: Any = random_hf(config, Qwen2_5_VLForConditionalGeneration)
    model.save_pretrained(folder)
    hf_tok: Any = copy.deepcopy(tokenizer.hf)
    hf_tok.add_special_tokens({"additional_special_tokens": SPECIAL})
    assert hf_tok.convert_tokens_to_ids(SPECIAL) == [VISION_START, VISION_END, IMAGE_TOKEN]
    hf_tok.chat_template = TEMPLATE
    hf_tok.save_pretrained(folder)
    processor(folder).save_pretrained(folder)
    return model


def processor(folder: Path | None = None) -> Any:
    from transformers import Qwen2VLImageProcessorPil

    if folder is not None and (folder / "preprocessor_config.json").is_file():
        return Qwen2VLImageProcessorPil.from_pretrained(folder)
    return Qwen2VLImageProcessorPil(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)


def reference(folder: Path, model: Any, text: str, images: list[bytes],
              max_tokens: int) -> tuple[int, str, list[float]]:
    """(prompt tokens, greedy reply, the first token's 5 best log-probabilities) as
    transformers computes them: the chat template over image and text parts, each
    `<|image_pad|>` repeated to its image's merged patches (as Qwen2_5_VLProcessor writes
    it), the processor's pixel values and grids, M-RoPE positions from the token types;
    then generate."""
    from transformers import AutoTokenizer

    tok: Any = AutoTokenizer.from_pretrained(folder)
    content = [*({"type": "image"} for _ in images), {"type": "text", "text": text}]
    prompt = tok.apply_chat_template([{"role": "user", "content": content}],
                                     add_generation_prompt=True, tokenize=False)
    pixels: Any = processor(folder)(images=[Image.open(io.BytesIO(i)) for i in images],
                                    return_tensors="pt")
    grids = pixels["image_grid_thw"]
    for thw in grids.tolist():  # a marker first, so an expanded image is not expanded again
        prompt = prompt.replace(SPECIAL[2], "<|marker|>" * (thw[0] * thw[1] * thw[2]
                                                           // MERGE ** 2), 1)
    prompt = prompt.replace("<|marker|>", SPECIAL[2])
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                             pixel_values=pixels["pixel_values"], image_grid_thw=grids,
                             mm_token_type_ids=(ids == IMAGE_TOKEN).int(),
                             max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                             do_sample=False, output_scores=True, return_dict_in_generate=True)
    first = torch.log_softmax(out.scores[0][0].float(), dim=-1).topk(5).values
    return ids.shape[1], str(tok.decode(out.sequences[0, ids.shape[1]:])), first.tolist()
