"""A seeded random tiny LLaVA-NeXT (LLaVA 1.6) built by transformers offline: the tiny LLaVA's
CLIP tower, projector and Llama text model, with pictures cut into 32-pixel tiles at the
pinpoint resolution that fits them; saved as a Hugging Face folder with SmolLM2's tokenizer
plus `<image>` and a LlavaNext image processor; and transformers' own greedy reply, the
reference the tests hold Ferry to."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from tests.tools.tiny_llava import IMAGE_TOKEN, assert_reply_equals, processed_reply

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
    processor = LlavaNextProcessor(LlavaNextImageProcessorPil.from_pretrained(folder), tok,
                                   patch_size=8, vision_feature_select_strategy="default",
                                   num_additional_image_tokens=1)
    return processed_reply(model, tok, processor, "<image>", text, images, max_tokens)


def assert_replies_equal(server: Any, folder: Path, model: Any,
                         sizes: list[tuple[int, int]]) -> None:
    """The served model's reply and prompt-token count after pictures of these (width,
    height) sizes equal transformers' (tiny_llava.assert_reply_equals)."""
    assert_reply_equals(server, sizes, lambda text, images, tokens: reference(
        folder, model, text, images, tokens))
