"""A seeded random tiny Mistral 3 built by transformers offline (a Pixtral tower with 2D
rotary positions, its projector merging 2 x 2 patches, a Mistral text model), or a tiny
Pixtral 12B (LLaVA over the same tower, its projector mapping each patch), saved as a
Hugging Face folder with SmolLM2's tokenizer plus Mistral's image tokens and a Pixtral
processor (pictures fit into 64 pixels, patch 8); and transformers' own greedy reply, the
reference the tests hold Ferry to."""
from __future__ import annotations

import contextlib
import copy
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.tools.tiny_llava import assert_reply_equals, processed_reply

# added after SmolLM2's 49152 tokens, in this order
SPECIAL = ["[IMG]", "[IMG_BREAK]", "[IMG_END]"]
IMAGE_TOKEN, IMAGE_BREAK, IMAGE_END = 49152, 49153, 49154
PATCH, MERGE, LONGEST = 8, 2, 64


@contextlib.contextmanager
def pil_only() -> Iterator[None]:
    """transformers' PixtralProcessor without torchvision (the index has no CPU build of it):
    the class asks for it, and its module imports the torchvision image processor's module
    for a function the Pillow one's module has too; given the Pillow image processor, it
    never uses torchvision."""
    from transformers.models.pixtral import image_processing_pil_pixtral
    from transformers.utils import import_utils

    mapping: Any = import_utils.BACKENDS_MAPPING
    saved = mapping["torchvision"]
    mapping["torchvision"] = (lambda: True, saved[1])
    name = "transformers.models.pixtral.image_processing_pixtral"
    module = sys.modules.get(name)
    if not import_utils.is_torchvision_available():
        sys.modules[name] = image_processing_pil_pixtral
    try:
        yield
    finally:
        mapping["torchvision"] = saved
        if module is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = module


def pixtral_processor() -> Any:
    """transformers' PixtralProcessor class (the package's name is a placeholder without
    torchvision)."""
    with pil_only():
        from transformers.models.pixtral.processing_pixtral import PixtralProcessor
    return PixtralProcessor


def processor(folder: Path, merge: int = MERGE) -> Any:
    """The folder's PixtralProcessor, its image processor the Pillow one."""
    from transformers import AutoTokenizer, PixtralImageProcessorPil

    with pil_only():
        return pixtral_processor()(PixtralImageProcessorPil.from_pretrained(folder),
                                AutoTokenizer.from_pretrained(folder), patch_size=PATCH,
                                spatial_merge_size=merge)


def build(folder: Path, tokenizer: Any, bias: bool = False, pixtral: bool = False) -> Any:
    """Write the tiny Mistral 3 into `folder` (SmolLM2's tokenizer, a copy); return
    transformers' model. `bias`: the projector's linear layers have biases. `pixtral`: a
    Pixtral 12B instead (LlavaForConditionalGeneration over the tower, a projector with
    biases and no merger, merge size 1)."""
    from transformers import (
        LlavaConfig,
        LlavaForConditionalGeneration,
        Mistral3Config,
        Mistral3ForConditionalGeneration,
        MistralConfig,
        PixtralImageProcessorPil,
        PixtralVisionConfig,
    )

    from tests.tools.random_hf import random_hf

    text = MistralConfig(vocab_size=49160, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, max_position_embeddings=1024, rms_norm_eps=1e-5,
                         sliding_window=None, initializer_range=0.2, tie_word_embeddings=False)
    # head_dim 8: two rotary frequencies for a patch's row, two for its column
    vision = PixtralVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                 num_attention_heads=4, head_dim=8, patch_size=PATCH,
                                 image_size=LONGEST, hidden_act="silu", initializer_range=0.2)
    config: Any
    if pixtral:
        config = LlavaConfig(vision_config=vision, text_config=text,
                             image_token_index=IMAGE_TOKEN, vision_feature_layer=-1,
                             vision_feature_select_strategy="full",
                             projector_hidden_act="gelu", tie_word_embeddings=False)
    else:
        config = Mistral3Config(vision_config=vision, text_config=text,
                                image_token_index=IMAGE_TOKEN, spatial_merge_size=MERGE,
                                multimodal_projector_bias=bias, tie_word_embeddings=False)
    model: Any = random_hf(config, LlavaForConditionalGeneration if pixtral
                           else Mistral3ForConditionalGeneration)
    model.save_pretrained(folder)
    hf_tok: Any = copy.deepcopy(tokenizer.hf)
    hf_tok.add_special_tokens({"additional_special_tokens": SPECIAL})
    assert hf_tok.convert_tokens_to_ids(SPECIAL) == [IMAGE_TOKEN, IMAGE_BREAK, IMAGE_END]
    images = PixtralImageProcessorPil(size={"longest_edge": LONGEST},
                                      patch_size={"height": PATCH, "width": PATCH})
    with pil_only():
        pixtral_processor()(images, hf_tok, patch_size=PATCH,
                         spatial_merge_size=1 if pixtral else MERGE).save_pretrained(folder)
    return model


def reference(folder: Path, model: Any, text: str, images: list[bytes],
              max_tokens: int) -> tuple[int, str]:
    """(prompt tokens, greedy reply) as transformers computes them: the chat template with
    `[IMG]` per picture, PixtralProcessor writing each picture's rows of `[IMG]` with
    `[IMG_BREAK]` and `[IMG_END]`, its pixel values and sizes; then generate."""
    from transformers import AutoTokenizer

    tok: Any = AutoTokenizer.from_pretrained(folder)
    merge = getattr(model.config, "spatial_merge_size", 1)  # Pixtral 12B's LLaVA: none
    return processed_reply(model, tok, processor(folder, merge), "[IMG]", text, images,
                           max_tokens)


def assert_replies_equal(server: Any, folder: Path, model: Any,
                         sizes: list[tuple[int, int]]) -> None:
    """The served model's reply and prompt-token count after pictures of these (width,
    height) sizes equal transformers' (tiny_llava.assert_reply_equals)."""
    assert_reply_equals(server, sizes, lambda text, images, tokens: reference(
        folder, model, text, images, tokens))
