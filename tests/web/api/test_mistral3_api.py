"""Mistral 3 (a Pixtral tower) through the API: a seeded random tiny one built by transformers
offline, served for real. Greedy replies and prompt-token counts equal transformers' float32
generate for pictures of several shapes (each at about its own aspect, its rows of positions
ended by [IMG_BREAK] and the last by [IMG_END]) and for two pictures at once; the same
picture hits the caches, another never shares its KV."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.tools.tiny_llava import assert_cached_by_picture, chat_server
from tests.tools.tiny_mistral3 import (
    IMAGE_BREAK,
    IMAGE_END,
    IMAGE_TOKEN,
    assert_replies_equal,
    build,
)

NAME = "tiny-mistral3"


@pytest.fixture(scope="module")
def mistral3(tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("mistral3")
    return folder, build(folder, tokenizer)


@pytest.fixture(scope="module")
def server(mistral3: tuple[Path, Any], make_server: Any) -> Any:
    folder, _ = mistral3
    return chat_server(make_server, folder, model_name=NAME, max_images=2,
                       max_image_pixels=200 * 200)


# 50 x 40 fits as it is (3 rows of 4 positions); 90 x 20 and 17 x 70 are scaled down to fit
# 64 pixels; 150 x 150 is scaled to exactly 64 a side
@pytest.mark.parametrize("sizes", [[(50, 40)], [(90, 20)], [(17, 70)], [(150, 150)],
                                   [(50, 40), (30, 80)]],
                         ids=["landscape", "wide", "tall", "large", "two"])
def test_replies_equal_transformers(server: Any, mistral3: tuple[Path, Any],
                                    sizes: list[tuple[int, int]]) -> None:
    assert_replies_equal(server, *mistral3, sizes)


def test_the_row_tokens_come_from_the_tokenizer(server: Any) -> None:
    tower = server.engine.executor.model.config.vision.tower
    assert (tower.break_token_id, tower.end_token_id) == (IMAGE_BREAK, IMAGE_END)
    assert server.engine.executor.model.config.vision.image_token_id == IMAGE_TOKEN


def test_models_say_vision(server: Any) -> None:
    cards = httpx.get(server.url + "/v1/models", timeout=10).json()["data"]
    assert [c["vision"] for c in cards] == [True]
    assert server.engine.executor.describe().endswith(", text + images")


def test_the_same_picture_hits_the_caches_another_does_not(server: Any) -> None:
    assert_cached_by_picture(server, "[IMG]", IMAGE_TOKEN)
