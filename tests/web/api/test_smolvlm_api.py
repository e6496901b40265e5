"""SmolVLM (Idefics3) through the API: a seeded random tiny model (SigLIP tower, pixel
shuffle, Llama text model) built by transformers offline, its processor splitting each image
into tiles plus a global image, served for real. Greedy replies and prompt-token counts
equal transformers' float32 generate for text + one image and text + two images of
different shapes; a typed `<image>` is refused."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.tools.tiny_idefics3 import IMAGE_TOKEN, build, reference
from tests.tools.tiny_llava import ask, assert_idle, chat_server, content, png

NAME = "tiny-smolvlm"


@pytest.fixture(scope="module")
def smolvlm(tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("smolvlm")
    return folder, build(folder, tokenizer)


@pytest.fixture(scope="module")
def server(smolvlm: tuple[Path, Any], make_server: Any) -> Any:
    folder, _ = smolvlm
    return chat_server(make_server, folder, {"max_context": 1024}, model_name=NAME,
                       max_images=2)



@pytest.mark.parametrize("sizes", [[(50, 40)], [(50, 40), (30, 90)]])
def test_replies_equal_transformers(server: Any, smolvlm: tuple[Path, Any],
                                    sizes: list[tuple[int, int]]) -> None:
    folder, model = smolvlm
    images = [png(seed, size) for seed, size in enumerate(sizes)]
    text = "What is in the picture?"
    r = ask(server, content(text, images))
    assert r.status_code == 200, r.text
    prompt_tokens, reply = reference(folder, model, text, images, 6)
    body = r.json()
    # each image is split (3 x 3 and 3 x 1 tiles plus the global one): far more than a tile
    assert body["usage"]["prompt_tokens"] == prompt_tokens > 40 * len(images)
    assert body["choices"][0]["message"]["content"] == reply
    assert_idle(server)


def test_models_say_vision(server: Any) -> None:
    cards = httpx.get(server.url + "/v1/models", timeout=10).json()["data"]
    assert [c["vision"] for c in cards] == [True]
    assert server.engine.executor.describe().endswith(", text + images")


def test_a_typed_image_token_is_refused(server: Any) -> None:
    r = ask(server, content("<image> and this?", [png(1)]))
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_image_placement"
    assert_idle(server)


def test_the_image_matters_and_repeats_hit_the_cache(server: Any) -> None:
    """Each tile keyed by its image: the same image again reuses its pages, another image
    of the same shape (the same tags and token count) shares none of them."""
    text = "Describe it."
    first = ask(server, content(text, [png(10)])).json()
    again = ask(server, content(text, [png(10)])).json()
    other = ask(server, content(text, [png(11)])).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 40
    assert again["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
    other_cached = (other["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    ids = server.engine.tokenizer.apply_chat_template([{"role": "user",
                                                        "content": "<image>" + text}])
    assert other_cached <= list(ids).index(IMAGE_TOKEN)  # at most the text before the image
    assert other["choices"][0]["message"]["content"] != first["choices"][0]["message"]["content"]
    assert_idle(server)


def test_tiles_unlike_the_tower_are_refused_at_load(smolvlm: tuple[Path, Any],
                                                     tmp_path: Path) -> None:
    """A processor cutting tiles of another size than the tower's would give more rows
    than the prompt holds tokens for: the model does not load, and says why."""
    import json
    import shutil

    from engine.execution.loading.loader import load_model
    from engine.execution.model.config import UnsupportedModel

    folder, _ = smolvlm
    shutil.copytree(folder, tmp_path / "m")
    file = tmp_path / "m" / "preprocessor_config.json"
    cfg = json.loads(file.read_text())
    file.write_text(json.dumps({**cfg, "max_image_size": {"longest_edge": 48}}))
    with pytest.raises(UnsupportedModel, match="differ from the vision tower"):
        load_model(tmp_path / "m")
