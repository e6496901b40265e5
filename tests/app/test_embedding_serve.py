"""`ferry serve --model <sentence-transformers folder>`: the server assembly loads it as an
embedding model (the encoder executor), the banner says how it runs, /v1/models marks it,
and /v1/embeddings answers while chat is refused."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from app.models import resolve_model
from app.paths import get_paths
from app.serve import build
from app.settings import Settings

pytestmark = pytest.mark.usefixtures("ferry_home")


def test_serve_a_folder_of_an_embedding_model(embedding_dir: Path, in_thread_server: Any,
                                              idle_check: Any) -> None:
    settings = Settings(model=str(embedding_dir), max_running=4, kv_tokens=2048)
    model = resolve_model(str(embedding_dir))
    app, _, runs, _ = build(settings, get_paths(), model, progress=False)
    assert runs.startswith("bert: safetensors float32, embeddings of 384 (mean pooling, "
                           "normalized)")
    server = in_thread_server(app, None, "uvicorn-embedding-serve", 120)
    engine = server.engine = app.state.services.engine
    try:
        assert engine.task == "embed" and engine.config.max_context == 256
        card = httpx.get(server.url + "/v1/models", timeout=10).json()["data"][0]
        assert card["embedding"] is True and card["architecture"] == "bert"
        r = httpx.post(server.url + "/v1/embeddings",
                       json={"input": ["one", "two"], "model": model.name}, timeout=60)
        assert r.status_code == 200, r.text
        assert [len(d["embedding"]) for d in r.json()["data"]] == [384, 384]
        r = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 400 and model.name in r.json()["error"]["message"]
        idle_check(engine)
    finally:
        server.stop()
