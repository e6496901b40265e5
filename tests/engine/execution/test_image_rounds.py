"""A vision model's images in the engine's rounds: with a prefill budget smaller than an
image, its positions span several chunks (the later ones take the encoder's cached rows), and
the greedy tokens still equal transformers' float32 generate; each image is encoded once while
its rows stay cached, again when the bounded cache let it go. An image's encoder runs ahead of
its chunk a slice a round, with another reply's decode rounds between."""
from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.tools.tiny_llava import IMAGE_TOKEN, TOKENS_PER_IMAGE, build, png


@pytest.fixture(scope="module")
def llava(tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("llava-rounds")
    return folder, build(folder, tokenizer)


def _engine(folder: Path, **fields: Any) -> Any:
    from engine import Engine, EngineConfig, ModelExecutor

    config = EngineConfig(page_size=4, kv_tokens=2048, max_context=512, kv_dtype="float32",
                          **fields)
    executor = ModelExecutor.from_pretrained(folder, config, dtype=torch.float32, threads=1)
    return Engine(executor.config, executor).start()


def _prompt(images: list[bytes], processor: Any) -> tuple[list[int], tuple[Any, ...]]:
    import io

    from PIL import Image

    from engine import ImageInput, expand_image_tokens, preprocess_image

    text = [1, 330, 2133, IMAGE_TOKEN, 281, 1056] + ([IMAGE_TOKEN] if images[1:] else []) \
        + [4456, 30]
    ids, offsets = expand_image_tokens(text, IMAGE_TOKEN, [TOKENS_PER_IMAGE] * len(images))
    return ids, tuple(ImageInput(hashlib.sha256(data).hexdigest(),
                                 preprocess_image(Image.open(io.BytesIO(data)), processor),
                                 offset, TOKENS_PER_IMAGE)
                      for data, offset in zip(images, offsets))


def _run(engine: Any, ids: list[int], images: tuple[Any, ...]) -> list[int]:
    from engine import SamplingParams

    handle = engine.submit(ids, SamplingParams(max_tokens=6, ignore_eos=True), images=images)
    for _ in handle.events():
        pass
    assert handle.final.finish_reason == "length", handle.final.error
    return list(handle.token_ids)


def _hf(model: Any, ids: list[int], images: tuple[Any, ...]) -> list[int]:
    with torch.inference_mode():
        out = model.generate(input_ids=torch.tensor([ids]),
                             pixel_values=torch.stack([i.pixels for i in images]),
                             max_new_tokens=6, min_new_tokens=6, do_sample=False)
    return [int(t) for t in out[0, len(ids):]]


@pytest.mark.parametrize("budget,capacity", [(6, 32), (6, 1), (1, 32)])
def test_chunked_images_equal_transformers(llava: tuple[Path, Any], budget: int,
                                           capacity: int) -> None:
    """Budget 6: an image's 16 positions over three rounds; budget 1: one position a round,
    each run as a single-token row."""
    folder, model = llava
    engine = _engine(folder, max_prefill_tokens=budget, prefix_cache=False)
    try:
        encoder = engine.executor.images
        encoder.capacity = capacity
        ids, images = _prompt([png(30), png(31)], engine.vision.processor)
        want = _hf(model, ids, images)
        assert _run(engine, ids, images) == want
        # evicting image 1 to keep image 2 (capacity 1) comes after image 1's last chunk
        assert encoder.encoded == 2
        assert _run(engine, ids, images) == want  # the same images again
        assert encoder.encoded == (2 if capacity > 1 else 4)
        assert len(encoder) == min(2, capacity)
        _all_given_back(engine)
    finally:
        engine.stop()


def _a_layer_a_round(folder: Path, seed: int) -> tuple[Any, Any, list[int], tuple[Any, ...]]:
    """(an engine whose encoder runs one tower layer a round, its encoder, a prompt with one
    picture, the picture)."""
    engine = _engine(folder, max_prefill_tokens=64, prefix_cache=False)
    engine.executor.images.slice_s = 0.0
    ids, images = _prompt([png(seed)], engine.vision.processor)
    return engine, engine.executor.images, ids, images


def _all_given_back(engine: Any) -> None:
    assert engine.wait_idle(30)
    snap = engine.snapshot()
    assert snap.kv.free == snap.kv.total and all(s is None for s in snap.slots)


def test_an_image_is_encoded_a_layer_a_round_beside_another_reply(
        llava: tuple[Path, Any]) -> None:
    from engine import SamplingParams

    folder, model = llava
    engine, encoder, ids, images = _a_layer_a_round(folder, 40)
    try:
        text = engine.submit(ids[:3], SamplingParams(max_tokens=30, ignore_eos=True))
        picture = engine.submit(ids, SamplingParams(max_tokens=6, ignore_eos=True),
                                images=images)
        for _ in picture.events():
            pass
        assert list(picture.token_ids) == _hf(model, ids, images)
        engine.cancel(text.id)
        _all_given_back(engine)
        encoding = [r for r in engine.snapshot().rounds if picture.id in r.encodes]
        layers = len(engine.executor.model.vision_tower.encoder.layers)
        assert len(encoding) == layers + 1  # a slice a layer, then the projector's
        assert all(text.id in r.decodes for r in encoding[1:])  # the reply went on meanwhile
        assert encoder.encoded == 1 and not encoder._started
    finally:
        engine.stop()


def test_a_request_cancelled_while_its_image_encodes_frees_everything(
        llava: tuple[Path, Any]) -> None:
    from engine import SamplingParams

    engine, encoder, ids, images = _a_layer_a_round(llava[0], 41)
    try:
        began, go_on = threading.Event(), threading.Event()
        advance = encoder.advance

        def first_slice_held(ahead: Any) -> None:  # the engine thread waits after a slice
            advance(ahead)
            began.set()
            go_on.wait(10)

        encoder.advance = first_slice_held
        picture = engine.submit(ids, SamplingParams(max_tokens=6), images=images)
        assert began.wait(10) and encoder._started  # a layer done, the tower not
        layers = engine.vision.layers
        assert engine.executor.image_progress(images[0].digest) == f"layer 2 of {layers}"
        engine.cancel(picture.id)  # applied before the next round
        go_on.set()
        for _ in picture.events():
            pass
        assert picture.final.finish_reason == "cancelled"
        _all_given_back(engine)
        assert not encoder._started and encoder.encoded == 0
    finally:
        engine.stop()


def test_a_text_engine_refuses_images(llava: tuple[Path, Any], model_dir: Path) -> None:
    from engine import Engine, EngineConfig, ModelExecutor, RequestError, SamplingParams

    executor = ModelExecutor.from_pretrained(model_dir, EngineConfig(kv_tokens=512), threads=1)
    engine = Engine(executor.config, executor).start()
    try:
        assert not engine.takes_images and engine.vision is None
        ids, images = _prompt([png(1)], _engine_processor(llava[0]))
        with pytest.raises(RequestError, match="takes no images"):
            engine.submit(ids, SamplingParams(max_tokens=2), images=images)
    finally:
        engine.stop()


def _engine_processor(folder: Path) -> Any:
    from engine import model_vision

    return model_vision(folder).processor
