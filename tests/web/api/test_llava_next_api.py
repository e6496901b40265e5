"""LLaVA 1.6 (LLaVA-NeXT) through the API: a seeded random tiny one built by transformers
offline, served for real. Greedy replies and prompt-token counts equal transformers' float32
generate for pictures of several shapes (each cut into its own grid of tiles) and for two
pictures at once; the same picture hits the caches, another never shares its KV."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.tools.tiny_llava import IMAGE_TOKEN, assert_cached_by_picture, chat_server
from tests.tools.tiny_llava_next import assert_replies_equal, build

NAME = "tiny-llava-next"


@pytest.fixture(scope="module")
def llava_next(tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("llava-next")
    return folder, build(folder, tokenizer)


@pytest.fixture(scope="module")
def server(llava_next: tuple[Path, Any], make_server: Any) -> Any:
    folder, _ = llava_next
    return chat_server(make_server, folder, model_name=NAME, max_images=2,
                       max_image_pixels=200 * 200)


@pytest.mark.parametrize("sizes", [[(50, 40)], [(90, 20)], [(17, 70)], [(64, 64)],
                                   [(50, 40), (30, 80)]],
                         ids=["landscape", "wide", "tall", "square", "two"])
def test_replies_equal_transformers(server: Any, llava_next: tuple[Path, Any],
                                    sizes: list[tuple[int, int]]) -> None:
    assert_replies_equal(server, *llava_next, sizes)


def test_models_say_vision(server: Any) -> None:
    cards = httpx.get(server.url + "/v1/models", timeout=10).json()["data"]
    assert [c["vision"] for c in cards] == [True]
    assert server.engine.executor.describe().endswith(", text + images")


def test_the_same_picture_hits_the_caches_another_does_not(server: Any) -> None:
    assert_cached_by_picture(server, "<image>", IMAGE_TOKEN)
