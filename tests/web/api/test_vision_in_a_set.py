"""A vision model beside the default chat model in one server (a model set): /v1/models says
which takes images before it loads, a request with images loads it and gets transformers'
reply, and the text model refuses images naming itself."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.tools.tiny_llava import build, content, png, reference, vision_set

NAME = "tiny-llava"


@pytest.fixture(scope="module")
def llava(tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("llava-set")
    return folder, build(folder, tokenizer)


@pytest.fixture(scope="module")
def server(model_dir: Path, llava: tuple[Path, Any], in_thread_server: Any,
           tmp_path_factory: pytest.TempPathFactory) -> Any:
    running = vision_set(in_thread_server, model_dir, llava[0], tmp_path_factory.mktemp("data"),
                         tmp_path_factory.mktemp("cache"), NAME)
    yield running
    running.stop()


def _ask(server: Any, model: str, text: str, images: list[bytes]) -> httpx.Response:
    return httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
        "model": model, "messages": [{"role": "user", "content": content(text, images)}],
        "max_tokens": 5, "temperature": 0, "ignore_eos": True})


def test_a_vision_model_in_a_set(server: Any, llava: tuple[Path, Any]) -> None:
    cards = {c["id"]: c for c in httpx.get(server.url + "/v1/models", timeout=10).json()["data"]}
    assert not cards[NAME]["loaded"] and cards[NAME]["vision"] and not cards["chat"]["vision"]
    # the chat page asks the set's ModelInfo and its ModelView
    infos = {m.name: m for m in server.engine.models()}
    assert infos[NAME].takes_images and not infos["chat"].takes_images
    assert server.engine.serving(NAME).takes_images
    from engine import describe_model_file

    assert describe_model_file(llava[0]).startswith("llava: safetensors")
    assert describe_model_file(llava[0]).endswith(", text + images")
    folder, model = llava
    images = [png(20), png(21)]
    r = _ask(server, NAME, "Compare them.", images)  # waits for the load, images and all
    assert r.status_code == 200, r.text
    prompt_tokens, reply = reference(folder, model, "Compare them.", images, 5)
    assert r.json()["usage"]["prompt_tokens"] == prompt_tokens
    assert r.json()["choices"][0]["message"]["content"] == reply
    assert {m.name: m for m in server.engine.models()}[NAME].takes_images  # loaded now
    refused = _ask(server, "chat", "hi", [png(0)])
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "model_takes_no_images"
    assert "chat" in refused.json()["error"]["message"]
    assert server.engine.table.wait_idle(30)


def test_the_timeline_names_encoder_rounds_for_a_vision_model_only(server: Any) -> None:
    def legend(model: str) -> str:
        page = httpx.get(server.url + "/dashboard", params={"model": model}, timeout=30).text
        start = page.index("Recent rounds")
        return page[start:page.index("</h2>", start)]

    assert "image encoder" in legend(NAME) and "decode" in legend(NAME)
    assert "image encoder" not in legend("chat") and "decode" in legend("chat")
