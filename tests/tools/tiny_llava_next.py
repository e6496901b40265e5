"""A seeded random tiny LLaVA-NeXT (LLaVA 1.6) built by transformers offline: the tiny LLaVA's
CLIP tower, projector and Llama text model, with pictures cut into 32-pixel tiles at the
pinpoint resolution that fits them; saved as a Hugging Face folder with SmolLM2's tokenizer
plus `<image>` and a LlavaNext image processor; and transformers' own greedy reply, the
reference the tests hold Ferry to."""
from __future__ import annotations

import copy
import io
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from tests.tools.tiny_llava import IMAGE_TOKEN, ask, assert_idle, content, png

PINPOINTS = [[32, 64], [64, 32], [64, 64], [96, 32]]


def build(folder: Path, tokenizer: Any) -> Any:
    """Write the tiny LLaVA-NeXT into `folder` (SmolLM2's tokenizer, a copy); return
    transformers' model."""
    from transformers import (
        CLIPVisionConfig,
        LlamaConfig,
        LlavaNextConfig,
        LlavaNextForConditionalGeneration,
        LlavaNextImageProcessorPil,
    )

    from tests.tools.random_hf import random_hf

    text = LlamaConfig(vocab_size=49160, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=1024, rms_norm_eps=1e-6, initializer_range=0.2,
                       tie_word_embeddings=False)
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                              num_attention_heads=4, image_size=32, patch_size=8,
                              initializer_range=0.2)
    config = LlavaNextConfig(vision_config=vision, text_config=text,
                             image_token_index=IMAGE_TOKEN, image_grid_pinpoints=PINPOINTS)
    model: Any = random_hf(config, LlavaNextForConditionalGeneration)
    with torch.no_grad():  # a newline that stands out, so that its place matters
        model.model.image_newline.copy_(torch.randn(64, generator=torch.Generator()
                                                    .manual_seed(1)))
    model.save_pretrained(folder)
    hf_tok: Any = copy.deepcopy(tokenizer.hf)
    hf_tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    assert hf_tok.convert_tokens_to_ids("<image>") == IMAGE_TOKEN
    hf_tok.save_pretrained(folder)
    LlavaNextImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32},
                               image_grid_pinpoints=PINPOINTS).save_pretrained(folder)
    return model


def reference(folder: Path, model: Any, text: str, images: list[bytes],
              max_tokens: int) -> tuple[int, str]:
    """(prompt tokens, greedy reply) as transformers computes them: the chat template with
    `<image>` per picture, LlavaNextProcessor expanding each to its picture's count, and its
    image processor's tiles and sizes."""
    from transformers import AutoTokenizer, LlavaNextImageProcessorPil, LlavaNextProcessor

    tok: Any = AutoTokenizer.from_pretrained(folder)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "<image>" * len(images) + text}],
        add_generation_prompt=True, tokenize=False)
    processor = LlavaNextProcessor(LlavaNextImageProcessorPil.from_pretrained(folder), tok,
                                   patch_size=8, vision_feature_select_strategy="default",
                                   num_additional_image_tokens=1)
    inputs: Any = processor(text=prompt, images=[Image.open(io.BytesIO(i)) for i in images],
                            return_tensors="pt")
    ids = inputs["input_ids"]
    with torch.inference_mode():
        out = model.generate(input_ids=ids, pixel_values=inputs["pixel_values"],
                             image_sizes=inputs["image_sizes"], max_new_tokens=max_tokens,
                             min_new_tokens=max_tokens, do_sample=False)
    return ids.shape[1], str(tok.decode(out[0, ids.shape[1]:]))


def assert_replies_equal(server: Any, folder: Path, model: Any,
                         sizes: list[tuple[int, int]]) -> None:
    """The served model's greedy 8-token reply to a question after pictures of these
    (width, height) sizes, and its prompt-token count, equal transformers'; every slot and
    KV page is back after it."""
    text = "What is in the picture?"
    images = [png(seed, size) for seed, size in enumerate(sizes)]
    r = ask(server, content(text, images), max_tokens=8)
    assert r.status_code == 200, r.text
    prompt_tokens, reply = reference(folder, model, text, images, 8)
    body = r.json()
    assert body["usage"]["prompt_tokens"] == prompt_tokens
    assert body["choices"][0]["message"]["content"] == reply
    assert_idle(server)
