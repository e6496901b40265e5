"""Qwen2.5-VL through the API: a seeded random tiny model (its vision transformer with window
attention, a Qwen2 text model with M-RoPE) built by transformers offline, served for real.
Images keep their aspect ratio, so each takes its own number of positions. Greedy replies,
prompt-token counts and the first token's log-probabilities equal transformers' float32
generate for text + one image and text + two images of different shapes, also when the
prefill budget cuts an image into several chunks."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.tools.tiny_llava import (
    ask_logprobs,
    assert_idle,
    assert_same_reply,
    chat_server,
    content,
    first_logprobs,
    png,
)
from tests.tools.tiny_qwen2_5_vl import build, reference

NAME = "tiny-qwen2.5-vl"
TEXT = "What is in the picture? Say it in a few words, please."
# (width, height): 5 x 4 and 3 x 7 positions after the processor's resize and 2 x 2 merge
SIZES = [(150, 100), (90, 200)]


@pytest.fixture(scope="module")
def qwen(tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("qwen2_5_vl")
    return folder, build(folder, tokenizer)


@pytest.fixture(scope="module")
def server(qwen: tuple[Path, Any], make_server: Any) -> Any:
    folder, _ = qwen
    return chat_server(make_server, folder, {"max_context": 1024}, model_name=NAME,
                       max_images=2)


@pytest.fixture(scope="module")
def small_chunks(qwen: tuple[Path, Any], make_server: Any) -> Any:
    """Prefill chunks of 7 positions: images computed in several rounds."""
    folder, _ = qwen
    return chat_server(make_server, folder, {"max_context": 1024, "max_prefill_tokens": 7},
                       model_name=NAME, max_images=2)




@pytest.mark.parametrize("count", [1, 2])
@pytest.mark.parametrize("which", ["server", "small_chunks"])
def test_replies_equal_transformers(which: str, count: int, qwen: tuple[Path, Any],
                                    request: pytest.FixtureRequest) -> None:
    folder, model = qwen
    images = [png(seed + 20 * count, size) for seed, size in enumerate(SIZES)][:count]
    assert_same_reply(request.getfixturevalue(which), TEXT, images,
                      reference(folder, model, TEXT, images, 6))


def test_models_say_vision(server: Any) -> None:
    cards = httpx.get(server.url + "/v1/models", timeout=10).json()["data"]
    assert [c["vision"] for c in cards] == [True]
    assert server.engine.executor.describe().endswith(", text + images")


def test_the_image_matters(server: Any) -> None:
    """The same image again gives the same numbers (the second from the encoder's cache),
    another one of the same size others."""
    text = "Describe it, please, in one or two short sentences."
    first = first_logprobs(ask_logprobs(server, content(text, [png(10, SIZES[0])])).json())
    again = first_logprobs(ask_logprobs(server, content(text, [png(10, SIZES[0])])).json())
    other = first_logprobs(ask_logprobs(server, content(text, [png(11, SIZES[0])])).json())
    assert again == pytest.approx(first, abs=1e-5)
    assert max(abs(a - b) for a, b in zip(other, first, strict=True)) > 1e-3
    assert_idle(server)


def test_an_image_past_the_aspect_limit_is_refused(server: Any) -> None:
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "model": "", "max_tokens": 2,
        "messages": [{"role": "user", "content": content("and this?", [png(3, (402, 2))])}]})
    assert r.status_code == 400, r.text
    assert "aspect ratio" in r.json()["error"]["message"]
    assert_idle(server)
