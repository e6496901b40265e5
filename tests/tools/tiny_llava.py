"""A seeded random tiny LLaVA built by transformers offline (CLIP tower, MLP projector, Llama
text model), saved as a Hugging Face folder with SmolLM2's tokenizer plus `<image>` and a CLIP
image processor; and transformers' own greedy reply for a prompt with images, the reference
the vision tests hold Ferry to."""
from __future__ import annotations

import base64
import copy
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from PIL import Image

IMAGE_TOKEN = 49152  # `<image>`, added after SmolLM2's 49152 tokens
TOKENS_PER_IMAGE = 16  # 32-pixel images, patch 8


def png(seed: int, size: tuple[int, int] = (50, 40)) -> bytes:
    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(out, "PNG")
    return out.getvalue()


def picture(size: tuple[int, int], mode: str = "RGB") -> Image.Image:
    """A random (width, height) picture in `mode` (RGB or RGBA), drawn from its size."""
    rng = np.random.default_rng(size[0] * 1000 + size[1])
    channels = {"RGB": 3, "RGBA": 4}[mode]
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], channels), dtype=np.uint8),
                           mode)


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def content(text: str, images: list[bytes]) -> list[dict[str, Any]]:
    """An OpenAI user content: the images first, then the text."""
    return [*({"type": "image_url", "image_url": {"url": data_url(i)}} for i in images),
            {"type": "text", "text": text}]


def ask(server: Any, content: Any, max_tokens: int = 6) -> httpx.Response:
    """A greedy chat request to the served model with this user `content`."""
    return httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
        "model": "", "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True})


def ask_logprobs(server: Any, content: Any) -> httpx.Response:
    """`ask` for 6 tokens with each one's 5 best log-probabilities."""
    return httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
        "model": "", "messages": [{"role": "user", "content": content}], "max_tokens": 6,
        "temperature": 0, "ignore_eos": True, "logprobs": True, "top_logprobs": 5})


def first_logprobs(body: dict[str, Any]) -> list[float]:
    """The first reply token's 5 best log-probabilities, best first."""
    top = body["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    return sorted((t["logprob"] for t in top), reverse=True)


def assert_same_reply(server: Any, text: str, images: list[bytes],
                      want: tuple[int, str, list[float]]) -> None:
    """The served model's greedy 6-token reply to `text` after `images` is `want` (a tiny
    model's transformers reference: prompt tokens, reply, the first token's 5 best
    log-probabilities, these within 2e-4), and every slot and KV page is back after it."""
    r = ask_logprobs(server, content(text, images))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["prompt_tokens"] == want[0]
    assert body["choices"][0]["message"]["content"] == want[1]
    assert first_logprobs(body) == pytest.approx(want[2], abs=2e-4)
    assert_idle(server)


def processed_reply(model: Any, tok: Any, processor: Any, placeholder: str, text: str,
                    images: list[bytes], max_tokens: int) -> tuple[int, str]:
    """(prompt tokens, greedy reply) as transformers computes them: the chat template with
    `placeholder` per picture before `text`, the family's `processor` writing the prompt's
    image tokens and the pixel values and sizes; then generate."""
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": placeholder * len(images) + text}],
        add_generation_prompt=True, tokenize=False)
    inputs: Any = processor(text=prompt, images=[Image.open(io.BytesIO(i)) for i in images],
                            return_tensors="pt")
    ids = inputs["input_ids"]
    with torch.inference_mode():
        out = model.generate(input_ids=ids, pixel_values=inputs["pixel_values"],
                             image_sizes=inputs["image_sizes"], max_new_tokens=max_tokens,
                             min_new_tokens=max_tokens, do_sample=False)
    return ids.shape[1], str(tok.decode(out[0, ids.shape[1]:]))


def assert_reply_equals(server: Any, sizes: list[tuple[int, int]],
                        reference: Callable[[str, list[bytes], int], tuple[int, str]]) -> None:
    """The served model's greedy 8-token reply to a question after pictures of these
    (width, height) sizes, and its prompt-token count, equal `reference`'s (a tiny model's
    transformers reference: text, pictures, tokens -> prompt tokens, reply); every slot and
    KV page is back after it."""
    text = "What is in the picture?"
    images = [png(seed, size) for seed, size in enumerate(sizes)]
    r = ask(server, content(text, images), max_tokens=8)
    assert r.status_code == 200, r.text
    prompt_tokens, reply = reference(text, images, 8)
    body = r.json()
    assert body["usage"]["prompt_tokens"] == prompt_tokens
    assert body["choices"][0]["message"]["content"] == reply
    assert_idle(server)


def assert_cached_by_picture(server: Any, placeholder: str, image_token: int) -> None:
    """The same picture twice hits the encoder and prefix caches and gets the same reply;
    another picture of the same size takes as many tokens and shares no KV past the text
    before it."""
    text = "Describe it."
    first = ask(server, content(text, [png(20, (70, 30))])).json()
    encoded = server.engine.executor.images.encoded
    again = ask(server, content(text, [png(20, (70, 30))])).json()
    assert server.engine.executor.images.encoded == encoded
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 16
    assert again["choices"][0]["message"]["content"] == \
        first["choices"][0]["message"]["content"]
    other = ask(server, content(text, [png(21, (70, 30))])).json()
    assert other["usage"]["prompt_tokens"] == first["usage"]["prompt_tokens"]
    cached = (other["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    ids = server.engine.tokenizer.apply_chat_template([{"role": "user",
                                                       "content": placeholder + text}])
    assert cached <= list(ids).index(image_token)  # at most the text before the picture
    assert_idle(server)


def assert_idle(server: Any) -> None:
    """The served engine idle with every slot and KV page back (none used or reserved)."""
    assert server.engine.wait_idle(30)
    snap = server.engine.snapshot()
    assert snap.kv.used == 0 and snap.kv.reserved == 0
    assert snap.kv.free + snap.kv.cached == snap.kv.total
    assert all(s is None for s in snap.slots)


def half_image_side(model: Any) -> None:
    """Round a transformers LLaVA's tower and projector matrices to float16 and back, as a
    projector file holds them: the reference for a GGUF."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ("vision_tower." in name or "multi_modal_projector." in name) and p.dim() in (2, 4):
                p.copy_(p.half().float())


def build(folder: Path, tokenizer: Any) -> Any:
    """Write the tiny LLaVA into `folder` (SmolLM2's tokenizer, a copy: `tokenizer` is the
    session's); return transformers' model."""
    from transformers import (
        CLIPImageProcessorPil,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
    )

    from tests.tools.random_hf import random_hf

    text = LlamaConfig(vocab_size=49160, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=512, rms_norm_eps=1e-6, initializer_range=0.2,
                       tie_word_embeddings=False)
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                              num_attention_heads=4, image_size=32, patch_size=8,
                              initializer_range=0.2)
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_index=IMAGE_TOKEN)
    model: Any = random_hf(config, LlavaForConditionalGeneration)
    model.save_pretrained(folder)
    hf_tok: Any = copy.deepcopy(tokenizer.hf)
    hf_tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    assert hf_tok.convert_tokens_to_ids("<image>") == IMAGE_TOKEN
    hf_tok.save_pretrained(folder)
    CLIPImageProcessorPil(size={"shortest_edge": 32},
                          crop_size={"height": 32, "width": 32}).save_pretrained(folder)
    return model


def reference(folder: Path, model: Any, text: str, images: list[bytes],
              max_tokens: int) -> tuple[int, str]:
    """(prompt tokens, greedy reply) as transformers computes them: its tokenizer's chat
    template with `<image>` per image, each expanded to the patch count as LlavaProcessor
    does, and its own image processor's pixel values."""
    from transformers import AutoTokenizer, CLIPImageProcessorPil

    tok: Any = AutoTokenizer.from_pretrained(folder)
    ids = tok.apply_chat_template([{"role": "user", "content": "<image>" * len(images) + text}],
                                  add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if not isinstance(ids, list) else ids
    expanded = [t for i in ids for t in ([i] * TOKENS_PER_IMAGE if i == IMAGE_TOKEN else [i])]
    processor: Any = CLIPImageProcessorPil.from_pretrained(folder)
    pixels = processor([Image.open(io.BytesIO(i)) for i in images],
                       return_tensors="pt")["pixel_values"]
    with torch.inference_mode():
        out = model.generate(input_ids=torch.tensor([expanded]), pixel_values=pixels,
                             max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                             do_sample=False)
    return len(expanded), str(tok.decode(out[0, len(expanded):]))


def text_part(model: Any, text_class: Any) -> Any:
    """The text model of a transformers vision model (its language model and head) as a
    `text_class` causal LM, the text side of a GGUF pair."""
    text = text_class(model.config.text_config).eval()
    text.model.load_state_dict(model.model.language_model.state_dict())
    text.lm_head.load_state_dict(model.lm_head.state_dict())
    return text


def gguf_server(make_server: Any, gguf: Path, name: str, tokenizers: Path) -> Any:
    """The text GGUF `gguf` with its projector beside it served for real, in float32 like
    the references; its describe line names the projector."""
    from engine import EngineConfig, ModelExecutor, Tokenizer
    from engine.execution.loading.projector_gguf import projector_beside

    fields: dict[str, Any] = {"page_size": 4, "kv_tokens": 4096, "max_context": 512,
                              "kv_dtype": "float32"}
    executor = ModelExecutor.from_pretrained(gguf, EngineConfig(**fields),
                                             dtype=torch.float32, threads=1)
    projector = projector_beside(gguf)
    assert projector is not None
    assert executor.describe().endswith(f", text + images (projector {projector.name})")
    return make_server(web={"model_name": name, "max_images": 2}, executor=executor,
                       tokenizer_override=Tokenizer(gguf, tokenizers), **fields)


def chat_server(make_server: Any, folder: Path, engine: dict[str, Any] | None = None,
                data_dir: Path | None = None, **web: Any) -> Any:
    """A tiny vision model in `folder` served for real by conftest's make_server (its chat page
    and its API), in float32 like `reference`; `engine`: more EngineConfig fields, `web`:
    WebConfig fields."""
    from engine import EngineConfig, Tokenizer
    from engine.execution.executor import ModelExecutor

    fields: dict[str, Any] = {"page_size": 4, "kv_tokens": 4096, "max_context": 512,
                              "kv_dtype": "float32", **(engine or {})}
    executor = ModelExecutor.from_pretrained(folder, EngineConfig(**fields),
                                             dtype=torch.float32, threads=1)
    return make_server(web={"model_name": "tiny-llava", **web}, executor=executor,
                       tokenizer_override=Tokenizer(folder), data_dir=data_dir, **fields)


def vision_set(in_thread_server: Any, model_dir: Path, folder: Path, data: Path, cache: Path,
               name: str = "tiny-llava", **web: Any) -> Any:
    """A running server over a model set: SmolLM2's GGUF as "chat" (the default, loaded) and
    the tiny LLaVA in `folder` as `name` (loaded on demand); `web`: WebConfig fields."""
    import dataclasses

    from engine import (
        Budget,
        EngineConfig,
        LoadedModel,
        ModelExecutor,
        ModelSet,
        ModelSource,
        Tokenizer,
        model_vision,
    )
    from tests.tools.model_sources import gguf_source
    from web.app import create_app
    from web.config import WebConfig

    config = EngineConfig(kv_tokens=4096, max_context=512, page_size=4)

    def load() -> LoadedModel:
        ex = ModelExecutor.from_pretrained(folder, dataclasses.replace(config, kv_dtype="float32"),
                                           dtype=torch.float32, threads=1)
        return LoadedModel(ex, ex.config, ex.describe(), ex.memory_bytes())

    seer = ModelSource(name, lambda: Tokenizer(folder), load, 20 << 20,
                       {"format": "safetensors"}, model_vision(folder))
    chat = gguf_source("chat", model_dir, config, cache)
    loaded, tokenizer = chat.load(), chat.open_tokenizer()
    models = ModelSet([chat, seer], loaded.config, Budget(2, 8 << 30),
                      preloaded={"chat": (loaded, tokenizer)}, poll=0.05)
    settings = WebConfig(data_dir=data, model_name="chat", model_runs=loaded.runs, **web)
    return in_thread_server(create_app(models, tokenizer, settings), models, "uvicorn-seer", 60)
