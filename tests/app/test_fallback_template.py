"""A base model's file, without a chat template, still chats: a GGUF written by
tests/tools/synthetic_gguf.py with no `tokenizer.chat_template`, built and served as
`ferry serve --model FILE` does it, through the API and the chat page; the banner,
/v1/models and `ferry doctor` name the plain fallback template."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from gguf import GGMLQuantizationType

from app import banner
from app.commands.doctor import model_checks
from app.models import resolve_model
from app.paths import get_paths
from app.serve import build
from app.settings import Settings
from engine.text.chat_template import FALLBACK_NAME
from tests.tools import synthetic_gguf
from tests.tools.waiting import wait_for

pytestmark = pytest.mark.usefixtures("ferry_home")


@pytest.fixture(scope="module")
def base_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("base") / "base-model.gguf"
    synthetic_gguf.write(out, hidden=64, layers=2, ff=128, heads=4, kv_heads=2,
                         qtype=GGMLQuantizationType.F16, untied=False, chat_template=False)
    return out


def test_doctor_names_the_fallback(base_gguf: Path) -> None:
    checks = {c.label: c for c in model_checks(Settings(model=str(base_gguf)), get_paths())}
    assert checks["chat template"].detail == FALLBACK_NAME
    assert checks["chat template"].status == "info"
    default = {c.label: c for c in model_checks(Settings(), get_paths())}
    assert default["chat template"].detail == "the model's own"


def test_serve_chats_through_the_fallback(base_gguf: Path, in_thread_server: Any,
                                          idle_check: Any) -> None:
    settings = Settings(model=str(base_gguf), max_running=2, kv_tokens=2048,
                        default_max_tokens=12, chat_temperature=0.0)
    model = resolve_model(str(base_gguf))
    app, device, runs, template = build(settings, get_paths(), model, progress=False)
    assert template == FALLBACK_NAME
    text = banner.banner(settings, model.name, device, runs, template)
    assert f"Chat:    template {FALLBACK_NAME}" in text
    server = in_thread_server(app, None, "uvicorn-fallback", 120)
    engine = server.engine = app.state.services.engine  # made by the app's lifespan
    try:
        card = httpx.get(server.url + "/v1/models", timeout=10).json()["data"][0]
        assert card["chat_template"] == FALLBACK_NAME and card["reasoning"] is False
        assert card["architecture"] == "llama" and card["runs"].startswith("llama: GGUF ")
        body = {"model": model.name, "max_tokens": 8, "temperature": 0, "messages": [
            {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}
        r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        reply = r.json()
        tokenizer = app.state.services.tokenizer
        prompt = tokenizer.decode(tokenizer.apply_chat_template(body["messages"]), False)
        assert prompt.endswith("Be brief.\n\nUser: Hi\nAssistant:")
        assert reply["usage"]["prompt_tokens"] == len(tokenizer.apply_chat_template(
            body["messages"]))
        assert isinstance(reply["choices"][0]["message"]["content"], str)
        assert "\nUser:" not in reply["choices"][0]["message"]["content"]
        # the chat page: a conversation, its reply, the page again
        r = httpx.post(server.url + "/c", data={"content": "Hello there"}, timeout=60,
                       follow_redirects=True)
        assert r.status_code == 200 and re.search(r"/c/\d+$", str(r.url))
        conv_id = int(str(r.url).rsplit("/", 1)[1])
        assert engine.wait_idle(60)
        store = app.state.services.store
        # an idle engine's wait_idle returns at once; the ended reply's write follows it
        def ended() -> Any:
            last = store.messages(conv_id)[-1]
            return None if last.is_streaming else last
        reply_msg = wait_for(ended, 30, "the reply to end")
        assert reply_msg.role == "assistant" and reply_msg.status == "complete"
        assert httpx.get(f"{server.url}/c/{conv_id}", timeout=30).status_code == 200
        idle_check(engine)
    finally:
        server.stop()
