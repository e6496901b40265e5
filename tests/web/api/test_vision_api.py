"""Images through the API: a seeded random tiny LLaVA (CLIP tower, MLP projector, Llama text
model) built by transformers offline with SmolLM2's tokenizer plus `<image>`, served for
real. Greedy replies and prompt-token counts equal transformers' float32 generate for text +
one image and text + two images; bad images get a 400 with a code; different images never
share KV."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.tools.tiny_llava import (
    IMAGE_TOKEN,
    ask,
    assert_idle,
    build,
    chat_server,
    content,
    data_url,
    png,
    reference,
)

NAME = "tiny-llava"


@pytest.fixture(scope="module")
def llava(tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("llava")
    return folder, build(folder, tokenizer)


@pytest.fixture(scope="module")
def server(llava: tuple[Path, Any], make_server: Any) -> Any:
    folder, _ = llava
    return chat_server(make_server, folder, model_name=NAME, max_images=2,
                       max_image_pixels=50 * 50)



@pytest.mark.parametrize("count", [1, 2])
def test_replies_equal_transformers(server: Any, llava: tuple[Path, Any], count: int) -> None:
    folder, model = llava
    images = [png(seed) for seed in range(count)]
    text = "What is in the picture?"
    r = ask(server, content(text, images))
    assert r.status_code == 200, r.text
    prompt_tokens, reply = reference(folder, model, text, images, 6)
    body = r.json()
    assert body["usage"]["prompt_tokens"] == prompt_tokens
    assert body["usage"]["completion_tokens"] == 6
    assert body["choices"][0]["message"]["content"] == reply
    assert_idle(server)


def test_models_say_vision(server: Any) -> None:
    cards = httpx.get(server.url + "/v1/models", timeout=10).json()["data"]
    assert [c["vision"] for c in cards] == [True]
    assert server.engine.takes_images
    assert server.engine.executor.describe().endswith(", text + images")


def test_different_images_never_share_kv(server: Any) -> None:
    text = "Describe it."
    first = ask(server, content(text, [png(10)])).json()
    again = ask(server, content(text, [png(10)])).json()
    other = ask(server, content(text, [png(11)])).json()
    # the same image: its pages come from the prefix cache; another image: none of its
    # pages (only the page-aligned text before it could match; it leads the message)
    cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 16 and again["choices"][0]["message"]["content"] == \
        first["choices"][0]["message"]["content"]
    offset = _image_offset(server, text)
    other_cached = (other["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    assert other_cached <= offset
    assert other["choices"][0]["message"]["content"] != first["choices"][0]["message"]["content"]
    assert_idle(server)


def _image_offset(server: Any, text: str) -> int:
    tok = server.engine.tokenizer
    ids = tok.apply_chat_template([{"role": "user", "content": "<image>" + text}])
    return list(ids).index(IMAGE_TOKEN)


@pytest.mark.parametrize("content,code", [
    ([{"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8="}}],
     "invalid_image"),
    ([{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}],
     "image_fetch_disabled"),
    ([{"type": "image_url", "image_url": {"url": data_url(png(0, (80, 80)))}}], "image_too_large"),
    ([{"type": "image_url", "image_url": {"url": data_url(png(i))}} for i in range(3)],
     "too_many_images"),
])
def test_bad_images_get_400(server: Any, content: Any, code: str) -> None:
    r = ask(server, content)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == code
    if code == "image_fetch_disabled":
        assert "not fetched" in r.json()["error"]["message"]
    assert_idle(server)


def test_a_placeholder_without_its_image_is_refused(server: Any) -> None:
    """`<image>` typed as text would run on the placeholder's own embedding: a 400."""
    r = ask(server, "<image> what is this?")
    assert r.status_code == 400 and "without an image" in r.json()["error"]["message"]
    r = ask(server, content("<image> and this?", [png(1)]))
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_image_placement"
    assert_idle(server)


def test_detail_is_accepted(server: Any) -> None:
    r = ask(server, [{"type": "image_url", "image_url": {"url": data_url(png(3)),
                                                          "detail": "low"}},
                      {"type": "text", "text": "hi"}], max_tokens=2)
    assert r.status_code == 200, r.text
    assert_idle(server)


def test_ollama_images_are_image_parts(server: Any) -> None:
    """Ollama's chat `images` (base64, no data: prefix) reach the model like image_url parts."""
    import base64

    image = png(5)
    want = ask(server, content("What is it?", [image])).json()["choices"][0]["message"]
    r = httpx.post(server.url + "/api/chat", timeout=120, json={
        "model": NAME, "stream": False, "options": {"num_predict": 6, "temperature": 0},
        "messages": [{"role": "user", "content": "What is it?",
                      "images": [base64.b64encode(image).decode()]}]})
    assert r.status_code == 200, r.text
    assert r.json()["message"]["content"] == want["content"]
    bad = httpx.post(server.url + "/api/generate", timeout=60, json={
        "model": NAME, "stream": False, "prompt": "hi", "images": ["aGVsbG8="]})
    assert bad.status_code == 400 and "could not be read" in bad.json()["error"]
    assert_idle(server)


def test_the_blocking_form_keeps_pixels_across_attempts(server: Any) -> None:
    """What the chat page calls from its worker thread: the same ids and images as the API's
    path, and each image decoded once however often the prompt is rebuilt."""
    from web.api.vision import build_image_prompt
    from web.config import WebConfig

    tok = server.engine.tokenizer
    turns = [{"role": "user", "content": content("first", [png(7)])},
             {"role": "assistant", "content": "ok"},
             {"role": "user", "content": content("second", [png(8)])}]
    cache: dict[str, Any] = {}
    config = WebConfig(data_dir=Path("."), max_images=4)
    whole = build_image_prompt(turns, server.engine, config, NAME,
                               tok.apply_chat_template, cache)
    assert len(whole.images) == 2 and len(cache) == 2
    assert [i.length for i in whole.images] == [16, 16]
    assert all(whole.ids[i.offset:i.end] == [IMAGE_TOKEN] * 16 for i in whole.images)
    kept = cache[turns[2]["content"][0]["image_url"]["url"]]
    shorter = build_image_prompt(turns[2:], server.engine, config, NAME,
                                 tok.apply_chat_template, cache)
    assert len(shorter.images) == 1 and shorter.images[0].pixels is kept.pixels


def test_a_text_model_refuses_images_by_name(make_server: Any) -> None:
    server = make_server(web={"model_name": "smol"})
    r = ask(server, content("hi", [png(0)]))
    assert r.status_code == 400 and r.json()["error"]["code"] == "model_takes_no_images"
    assert "smol" in r.json()["error"]["message"]
    cards = httpx.get(server.url + "/v1/models", timeout=10).json()["data"]
    assert [c["vision"] for c in cards] == [False]
