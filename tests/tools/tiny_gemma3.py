"""A seeded random tiny Gemma 3 with images (SigLIP tower, average-pooled projector, Gemma 3
text model: five sliding layers, then a global one, the pattern llama.cpp assumes) built by
transformers offline, saved as a Hugging Face folder with SmolLM2's tokenizer plus Gemma 3's
image tags, a Gemma-shaped chat template and a Gemma 3 image processor; and transformers' own
greedy reply for a prompt with images (Gemma3Processor's prompt text, its pixel values, its
bidirectional mask over each image's tokens), the reference the vision tests hold Ferry to."""
from __future__ import annotations

import copy
import io
import json
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from tests.tools.synthetic_gguf import GEMMA3_TEMPLATE

# added after SmolLM2's 49152 tokens, in this order
SPECIAL = ["<start_of_image>", "<end_of_image>", "<image_soft_token>"]
BOI, EOI, IMAGE_TOKEN = 49152, 49153, 49154
TOKENS_PER_IMAGE = 16  # 64-pixel images, patch 8: 8 x 8 patches pooled to 4 x 4
WINDOW = 24  # the sliding layer's: shorter than the prompts, longer than an image
TEMPLATE = GEMMA3_TEMPLATE  # image parts as <start_of_image>, text parts trimmed


def build(folder: Path, tokenizer: Any) -> Any:
    """Write the tiny Gemma 3 into `folder` (SmolLM2's tokenizer, a copy: `tokenizer` is the
    session's); return transformers' model."""
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3ImageProcessorPil,
        Gemma3TextConfig,
        SiglipVisionConfig,
    )

    from tests.tools.random_hf import random_hf

    text = Gemma3TextConfig(vocab_size=49160, hidden_size=64, intermediate_size=128,
                            num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=16, query_pre_attn_scalar=16, sliding_window=WINDOW,
                            max_position_embeddings=1024, initializer_range=0.2)
    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                num_attention_heads=4, image_size=64, patch_size=8,
                                initializer_range=0.2)
    config = Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(),
                          mm_tokens_per_image=TOKENS_PER_IMAGE, boi_token_index=BOI,
                          eoi_token_index=EOI, image_token_index=IMAGE_TOKEN)
    model: Any = random_hf(config, Gemma3ForConditionalGeneration)
    with torch.no_grad():  # transformers starts the projection at zero: images would not count
        weight = model.model.multi_modal_projector.mm_input_projection_weight
        weight.copy_(torch.randn(weight.shape, generator=torch.Generator().manual_seed(1)))
    model.save_pretrained(folder)
    hf_tok: Any = copy.deepcopy(tokenizer.hf)
    hf_tok.add_special_tokens({"additional_special_tokens": SPECIAL})
    assert hf_tok.convert_tokens_to_ids(SPECIAL) == [BOI, EOI, IMAGE_TOKEN]
    hf_tok.chat_template = TEMPLATE
    hf_tok.save_pretrained(folder)
    Gemma3ImageProcessorPil(size={"height": 64, "width": 64}).save_pretrained(folder)
    # as Gemma 3's own preprocessor_config.json says it (llama.cpp's converter reads it)
    file = folder / "preprocessor_config.json"
    file.write_text(json.dumps({**json.loads(file.read_text()),
                                "image_seq_length": TOKENS_PER_IMAGE}))
    return model


def reference(folder: Path, model: Any, text: str, images: list[bytes],
              max_tokens: int) -> tuple[int, str, list[float]]:
    """(prompt tokens, greedy reply, the first token's 5 best log-probabilities) as
    transformers computes them: the chat template over image and text parts,
    Gemma3Processor (its image text, pixel values and token types, which make each image's
    tokens attend both ways), then generate."""
    from transformers import AutoTokenizer, Gemma3ImageProcessorPil, Gemma3Processor

    tok: Any = AutoTokenizer.from_pretrained(folder)
    tok.boi_token, tok.eoi_token, tok.image_token = SPECIAL
    tok.boi_token_id, tok.eoi_token_id, tok.image_token_id = BOI, EOI, IMAGE_TOKEN
    content = [*({"type": "image"} for _ in images), {"type": "text", "text": text}]
    prompt = tok.apply_chat_template([{"role": "user", "content": content}],
                                     add_generation_prompt=True, tokenize=False)
    processor = Gemma3Processor(Gemma3ImageProcessorPil.from_pretrained(folder), tok,
                                image_seq_length=TOKENS_PER_IMAGE)
    inputs: Any = processor(text=prompt, images=[Image.open(io.BytesIO(i)) for i in images],
                            return_tensors="pt")
    ids = inputs["input_ids"]
    assert int((ids == IMAGE_TOKEN).sum()) == TOKENS_PER_IMAGE * len(images)
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=inputs["attention_mask"],
                             pixel_values=inputs["pixel_values"],
                             token_type_ids=inputs["token_type_ids"],
                             max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                             do_sample=False, output_scores=True, return_dict_in_generate=True)
    first = torch.log_softmax(out.scores[0][0].float(), dim=-1).topk(5).values
    return ids.shape[1], str(tok.decode(out.sequences[0, ids.shape[1]:])), first.tolist()
