"""Requests with images in the simulator: image positions are prompt work for the scheduler
(the prefill budget chunks them), a waiting request says which image its next chunk
encodes, and the prefix cache keys image positions by the image, never by its token."""
from __future__ import annotations

from typing import Any

import pytest

from engine.sim.scenario import ScenarioError, parse
from engine.sim.simulator import format_table, simulate

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


def test_an_image_encoded_ahead_takes_rounds_beside_another_reply() -> None:
    """`encode`: the image's encoder runs ahead of its chunk, a round at a time, as a vision
    model's engine runs it; the text reply decodes in each of those rounds."""
    prompt = list(range(1, 5)) + IMAGE + [5, 6]
    result = _run({"max_running": 2, "max_prefill_tokens": 64, "kv_tokens": 256,
                   "page_size": 4, "prefix_cache": False},
                  [{"id": "T", "prompt": 6, "output": 8},
                   {"id": "P", "arrive": 1, "prompt_ids": prompt, "output": 2,
                    "images": [{"at": 4, "tokens": 8, "encode": 3}]}])
    rounds = result["rounds"]
    encoding = [r for r in rounds if "P" in r.get("encodes", [])]
    assert [r["round"] for r in encoding] == [1, 2, 3]
    # the first beside P's text before the image (prefill-first), the others beside T's decode
    assert all(any(b["id"] == "T" for b in r["batch"]) for r in encoding[1:])
    assert [b["tokens"] for r in rounds for b in r["batch"] if b["id"] == "P"] == [4, 10, 1]
    assert [r["waiting_reasons"]["P"]["text"] for r in encoding] == [
        "encoding image 1 of 1, round 2 of 3", "encoding image 1 of 1, round 3 of 3",
        "prefill chunk 2 of 2: 4 of 14 prompt tokens done"]  # encoded: its chunk is next
    assert result["requests"]["P"]["finish_reason"] == "length"
    alone = _run({"max_running": 2, "max_prefill_tokens": 64, "kv_tokens": 256,
                  "page_size": 4, "prefix_cache": False},
                 [{"id": "P", "prompt_ids": prompt, "output": 1,
                   "images": [{"at": 4, "tokens": 8, "encode": 2}]}])
    assert [r["phase"] for r in alone["rounds"]] == ["prefill", "encode", "prefill"]
    assert "P:E" in format_table(alone)


@pytest.mark.parametrize("images", [[{"at": 25, "tokens": 8}], [{"at": 0}],
                                    [{"at": 0, "tokens": 4}, {"at": 2, "tokens": 4}], "x",
                                    [{"at": 0, "tokens": 4, "whole": "yes"}],
                                    [{"at": 0, "tokens": 4, "encode": -1}]])
def test_bad_images_are_scenario_errors(images: object) -> None:
    with pytest.raises(ScenarioError, match="images"):
        parse({"engine": {}, "requests": [{"id": "A", "prompt": 30, "output": 1,
                                           "images": images}]})
