"""A seeded random tiny SmolVLM (Idefics3: SigLIP tower, pixel-shuffle connector, Llama text
model) built by transformers offline, saved as a Hugging Face folder with SmolLM2's tokenizer
plus SmolVLM's image tokens and an Idefics3 image processor that splits every image into
tiles; and transformers' own greedy reply for a prompt with images, the reference the
vision tests hold Ferry to."""
from __future__ import annotations

import copy
import io
from pathlib import Path
from typing import Any

import torch
from PIL import Image

# added after SmolLM2's 49152 tokens, in this order
SPECIAL = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>",
           *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7))]
IMAGE_TOKEN = 49153
TOKENS_PER_TILE = 4  # 32-pixel tiles, patch 8: 16 patches, shuffled by 2


def build(folder: Path, tokenizer: Any) -> Any:
    """Write the tiny SmolVLM into `folder` (SmolLM2's tokenizer, a copy: `tokenizer` is the
    session's); return transformers' model."""
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessorPil,
        Idefics3VisionConfig,
        LlamaConfig,
    )

    from tests.tools.random_hf import random_hf

    text = LlamaConfig(vocab_size=49200, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=1024, rms_norm_eps=1e-6, initializer_range=0.2,
                       tie_word_embeddings=False)
    vision = Idefics3VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, image_size=32, patch_size=8,
                                  initializer_range=0.2)
    config = Idefics3Config(vision_config=vision.to_dict(), text_config=text.to_dict(),
                            scale_factor=2, image_token_id=IMAGE_TOKEN,
                            tie_word_embeddings=False)
    model: Any = random_hf(config, Idefics3ForConditionalGeneration)
    model.save_pretrained(folder)
    hf_tok: Any = copy.deepcopy(tokenizer.hf)
    hf_tok.add_special_tokens({"additional_special_tokens": SPECIAL})
    assert hf_tok.convert_tokens_to_ids("<image>") == IMAGE_TOKEN
    hf_tok.save_pretrained(folder)
    Idefics3ImageProcessorPil(size={"longest_edge": 96},
                              max_image_size={"longest_edge": 32}).save_pretrained(folder)
    return model


def reference(folder: Path, model: Any, text: str, images: list[bytes],
              max_tokens: int) -> tuple[int, str]:
    """(prompt tokens, greedy reply) as transformers computes them: its tokenizer's chat
    template with `<image>` per image, then Idefics3's processor (tiles, their tags and
    image tokens, its pixel values) and generate."""
    from transformers import AutoTokenizer, Idefics3ImageProcessorPil, Idefics3Processor

    tok: Any = AutoTokenizer.from_pretrained(folder)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "<image>" * len(images) + text}],
        add_generation_prompt=True, tokenize=False)
    processor = Idefics3Processor(Idefics3ImageProcessorPil.from_pretrained(folder), tok,
                                  image_seq_len=TOKENS_PER_TILE)
    inputs: Any = processor(text=prompt, images=[Image.open(io.BytesIO(i)) for i in images],
                            return_tensors="pt")
    ids = inputs["input_ids"]
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=inputs["attention_mask"],
                             pixel_values=inputs["pixel_values"],
                             pixel_attention_mask=inputs["pixel_attention_mask"],
                             max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                             do_sample=False)
    return ids.shape[1], str(tok.decode(out[0, ids.shape[1]:]))
