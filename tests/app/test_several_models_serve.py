"""`ferry serve --model default --model FILE` as app builds it: the default SmolLM2 GGUF and a
second, different small GGUF written by the test writer (random weights, no chat template:
it chats through the plain fallback). Both answer through the API, each with its own
tokenizer and template; the second loads on its first request."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from gguf import GGMLQuantizationType

from app.paths import get_paths
from app.preflight import served_models
from app.serve import build_several
from app.settings import Settings
from engine.text.chat_template import FALLBACK_NAME
from tests.tools import synthetic_gguf

pytestmark = [pytest.mark.usefixtures("ferry_home"), pytest.mark.model]


@pytest.fixture(scope="module")
def base_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("base") / "base-model.gguf"
    synthetic_gguf.write(out, hidden=64, layers=2, ff=128, heads=4, kv_heads=2,
                         qtype=GGMLQuantizationType.F16, untied=False, chat_template=False)
    return out


def test_two_models_from_the_command_line(base_gguf: Path, in_thread_server: Any,
                                          idle_check: Any) -> None:
    settings = Settings(models=["default", str(base_gguf)], max_running=2, kv_tokens=2048,
                        default_max_tokens=12, chat_temperature=0.0, keep_alive="0")
    refs = served_models(settings)
    assert [r.name for r in refs] == ["SmolLM2-135M-Instruct", "base-model"]
    app, _, runs, template = build_several(settings, get_paths(), refs, progress=False)
    assert runs.startswith("llama: GGUF") and template != FALLBACK_NAME
    server = in_thread_server(app, None, "uvicorn-several", 120)
    models = server.engine = app.state.services.engine  # started by the app's lifespan
    try:
        cards = {c["id"]: c for c in httpx.get(server.url + "/v1/models").json()["data"]}
        assert list(cards) == ["SmolLM2-135M-Instruct", "base-model"]
        assert cards["SmolLM2-135M-Instruct"]["loaded"] and cards["base-model"]["state"] == \
            "unloaded"
        assert cards["base-model"]["runs"].startswith("llama: GGUF")  # read from the file
        assert cards["base-model"]["size"] == base_gguf.stat().st_size
        for name in ("SmolLM2-135M-Instruct", "base-model"):
            body = {"model": name, "max_tokens": 6, "temperature": 0,
                    "messages": [{"role": "user", "content": "Hi"}]}
            r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
            assert r.status_code == 200, r.text
            reply = r.json()
            assert reply["model"] == name and reply["usage"]["completion_tokens"] >= 1
        # each model chats with its own template: the base model's is the plain fallback
        assert models.tokenizer("base-model").chat_template_name == FALLBACK_NAME
        assert models.tokenizer(None).chat_template_name != FALLBACK_NAME
        chat = [{"role": "user", "content": "Hi"}]
        assert models.tokenizer("base-model").apply_chat_template(chat) != \
            models.tokenizer(None).apply_chat_template(chat)
        idle_check(models)
    finally:
        server.stop()
