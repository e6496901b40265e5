"""Gemma 3 with images through the API: a seeded random tiny model (SigLIP tower, pooled
projector, Gemma 3 text model with a sliding layer) built by transformers offline, served
for real. Greedy replies and prompt-token counts equal transformers' float32 generate, whose
mask lets an image's tokens attend to one another both ways, for text + one image and text +
two images, also when the prefill budget would cut an image in two chunks; a typed
`<start_of_image>` is refused."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.tools.tiny_gemma3 import build, reference
from tests.tools.tiny_llava import (
    ask,
    ask_logprobs,
    assert_idle,
    assert_same_reply,
    chat_server,
    content,
    first_logprobs,
    png,
)

NAME = "tiny-gemma3"
TEXT = "What is in the picture? Say it in a few words, please, and then some more."


@pytest.fixture(scope="module")
def gemma3(tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("gemma3")
    return folder, build(folder, tokenizer)


@pytest.fixture(scope="module")
def server(gemma3: tuple[Path, Any], make_server: Any) -> Any:
    folder, _ = gemma3
    return chat_server(make_server, folder, {"max_context": 1024}, model_name=NAME,
                       max_images=2)


@pytest.fixture(scope="module")
def small_chunks(gemma3: tuple[Path, Any], make_server: Any) -> Any:
    """Prefill chunks of 7 positions: most of them would end inside an image."""
    folder, _ = gemma3
    return chat_server(make_server, folder, {"max_context": 1024, "max_prefill_tokens": 7},
                       model_name=NAME, max_images=2)



@pytest.mark.parametrize("count", [1, 2])
@pytest.mark.parametrize("which", ["server", "small_chunks"])
def test_replies_equal_transformers(which: str, count: int, gemma3: tuple[Path, Any],
                                    request: pytest.FixtureRequest) -> None:
    folder, model = gemma3
    images = [png(seed + 20 * count, size) for seed, size in enumerate([(50, 40), (30, 90)])]
    images = images[:count]
    # the image's tokens attending causally instead moves the log-probabilities by ~0.01-0.1
    assert_same_reply(request.getfixturevalue(which), TEXT, images,
                      reference(folder, model, TEXT, images, 6))


def test_models_say_vision(server: Any) -> None:
    cards = httpx.get(server.url + "/v1/models", timeout=10).json()["data"]
    assert [c["vision"] for c in cards] == [True]
    assert server.engine.executor.describe().endswith(", text + images")
    assert server.engine.executor.attention.name == "torch"


def test_a_typed_image_tag_is_refused(server: Any) -> None:
    r = ask(server, content("<start_of_image> and this?", [png(1)]))
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_image_placement"
    assert_idle(server)


def test_the_image_matters(server: Any) -> None:
    """The same image again gives the same numbers, another one of the same size others."""
    text = "Describe it, please, in one or two short sentences."
    first = first_logprobs(ask_logprobs(server, content(text, [png(10)])).json())
    again = first_logprobs(ask_logprobs(server, content(text, [png(10)])).json())
    other = first_logprobs(ask_logprobs(server, content(text, [png(11)])).json())
    assert again == pytest.approx(first, abs=1e-5)
    assert max(abs(a - b) for a, b in zip(other, first)) > 1e-2
    assert_idle(server)
