"""Requests with images in the simulator: image positions are prompt work for the scheduler
(the prefill budget chunks them), a waiting request says which image its next chunk
encodes, and the prefix cache keys image positions by the image, never by its token."""
from __future__ import annotations

from typing import Any

import pytest

from engine.sim.scenario import ScenarioError, parse
from engine.sim.simulator import simulate

SYSTEM = list(range(100, 116))  # four pages of 4
IMAGE = [900] * 8  # one placeholder id for every image, as a vision model's prompt has


def _run(engine: dict[str, Any], requests: list[dict[str, Any]]) -> dict[str, Any]:
    return simulate(parse({"engine": engine, "requests": requests}))


def _first_batch(result: dict[str, Any], rid: str) -> int:
    return int(next(b["tokens"] for r in result["rounds"] for b in r["batch"]
                    if b["id"] == rid))


def test_prefix_cache_keys_image_positions_by_image() -> None:
    prompt = SYSTEM + IMAGE + [1, 2, 3, 4]
    requests = [{"id": "A", "prompt_ids": prompt, "output": 2,
                 "images": [{"at": 16, "tokens": 8, "id": "cat"}]},
                {"id": "B", "arrive": 5, "prompt_ids": prompt, "output": 2,
                 "images": [{"at": 16, "tokens": 8, "id": "dog"}]},
                {"id": "C", "arrive": 10, "prompt_ids": prompt, "output": 2,
                 "images": [{"at": 16, "tokens": 8, "id": "cat"}]}]
    result = _run({"max_running": 4, "max_prefill_tokens": 64, "kv_tokens": 256,
                   "page_size": 4, "prefix_cache": True}, requests)
    assert _first_batch(result, "A") == 28
    assert _first_batch(result, "B") == 28 - 16  # the text before the image only
    assert _first_batch(result, "C") == 4  # the same image: all but the last page
    assert all(r["finish_reason"] == "length" for r in result["requests"].values())


def test_waiting_reason_names_the_image_its_chunk_encodes() -> None:
    prompt = list(range(1, 11)) + IMAGE + [11, 12] + IMAGE + [13, 14]
    result = _run({"max_running": 2, "max_prefill_tokens": 8, "kv_tokens": 256,
                   "page_size": 4, "prefix_cache": False},
                  [{"id": "A", "prompt_ids": prompt, "output": 1,
                    "images": [{"at": 10, "tokens": 8}, {"at": 20, "tokens": 8}]}])
    texts = [r["waiting_reasons"]["A"]["text"] for r in result["rounds"]
             if "A" in r["waiting_reasons"]]
    assert "encoding image 1 of 2" in texts and "encoding image 2 of 2" in texts
    assert [b["tokens"] for r in result["rounds"] for b in r["batch"]][:4] == [8, 8, 8, 6]


def test_an_image_attended_whole_is_never_split_between_chunks() -> None:
    """Chunks of 8 would end inside both images (10..18, 20..28): the first chunk stops
    before the first image, the next takes it whole past the budget, and so on."""
    prompt = list(range(1, 11)) + IMAGE + [11, 12] + IMAGE + [13, 14]
    images = [{"at": 10, "tokens": 8, "whole": True}, {"at": 20, "tokens": 8, "whole": True}]
    result = _run({"max_running": 2, "max_prefill_tokens": 8, "kv_tokens": 256,
                   "page_size": 4, "prefix_cache": False},
                  [{"id": "A", "prompt_ids": prompt, "output": 1, "images": images}])
    assert [b["tokens"] for r in result["rounds"] for b in r["batch"]][:4] == [8, 2, 8, 2]
    assert result["requests"]["A"]["finish_reason"] == "length"


@pytest.mark.parametrize("images", [[{"at": 25, "tokens": 8}], [{"at": 0}],
                                    [{"at": 0, "tokens": 4}, {"at": 2, "tokens": 4}], "x",
                                    [{"at": 0, "tokens": 4, "whole": "yes"}]])
def test_bad_images_are_scenario_errors(images: object) -> None:
    with pytest.raises(ScenarioError, match="images"):
        parse({"engine": {}, "requests": [{"id": "A", "prompt": 30, "output": 1,
                                           "images": images}]})
