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
from engine.execution.model.linear_kernels import native_bf16_products

pytestmark = pytest.mark.usefixtures("ferry_home")


def test_serve_a_folder_of_an_embedding_model(embedding_dir: Path, in_thread_server: Any,
                                              idle_check: Any) -> None:
    settings = Settings(model=str(embedding_dir), max_running=4, kv_tokens=2048)
    model = resolve_model(str(embedding_dir))
    app, _, runs, _ = build(settings, get_paths(), model, progress=False)
    products = " (bf16 products)" if native_bf16_products() else ""
    assert runs.startswith(f"bert: safetensors float32{products}, embeddings of 384 (mean "
                           "pooling, normalized)")
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


def test_embedding_models_beside_the_default_chat_model(embedding_dir: Path, tmp_path: Path,
                                                        in_thread_server: Any,
                                                        idle_check: Any) -> None:
    """Served as configured models of a set: before they load, /v1/models says what each
    does and a chat request to one is a 400 naming it; each request on the dashboard's list
    says the endpoint it came through."""
    from app.preflight import served_models
    from app.serve import build_several
    from tests.tools.bert_gguf import write_bert_gguf

    gguf = write_bert_gguf(embedding_dir, tmp_path / "minilm-gguf.gguf")
    settings = Settings(models=["default", str(embedding_dir), str(gguf)], max_running=2,
                        kv_tokens=2048, default_max_tokens=4, keep_alive="0")
    refs = served_models(settings)
    names = [r.name for r in refs]
    app, _, _, _ = build_several(settings, get_paths(), refs, progress=False)
    server = in_thread_server(app, None, "uvicorn-embedding-set", 120)
    models = server.engine = app.state.services.engine
    try:
        cards = {c["id"]: c for c in httpx.get(server.url + "/v1/models").json()["data"]}
        assert [cards[n]["task"] for n in names] == ["generate", "embed", "embed"]
        assert [cards[n]["embedding"] for n in names] == [False, True, True]
        assert cards[names[1]]["state"] == cards[names[2]]["state"] == "unloaded"
        for name in names[1:]:
            r = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
                "model": name, "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 400 and r.json()["error"]["param"] == "model"
            assert repr(name) in r.json()["error"]["message"]
        seen = {}
        for path, body in (("/v1/chat/completions", {
                "model": names[0], "messages": [{"role": "user", "content": "hi"}]}),
                ("/v1/embeddings", {"model": names[2], "input": "one"}),
                ("/v1/completions", {"model": names[0], "prompt": "Once"})):
            r = httpx.post(server.url + path, json=body, timeout=120)
            assert r.status_code == 200, r.text
            info = httpx.get(f"{server.url}/v1/requests/{r.headers['X-Request-Id']}",
                             timeout=10).json()
            seen[path] = info["endpoint"]
        assert seen == {p: p for p in seen}
        cards = {c["id"]: c for c in httpx.get(server.url + "/v1/models").json()["data"]}
        assert cards[names[2]]["task"] == "embed"  # loaded and (keep_alive 0) unloaded again
        idle_check(models)
    finally:
        server.stop()
