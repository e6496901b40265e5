"""A shared server with several models, as `ferry serve` builds it, and an Ollama store beside
it: a normal user learns a model's name, never where its files lie (API errors, /v1/models,
the dashboard, the chat page), while the admin keeps the detail; a model whose file vanished
answers 503 naming it; a store entry that leads out of its store is never served.

The models are the default SmolLM2 GGUF and hard links of it under other names."""
from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.discovery import models_to_serve
from app.models import default_gguf
from app.paths import get_paths
from app.serve import build_several
from app.settings import Settings

pytestmark = [pytest.mark.usefixtures("ferry_home"), pytest.mark.model]


def ollama_store(root: Path, gguf: Path) -> None:
    """smol:1 in place; evil:1 names a file by an absolute path; link:1 a blob linked out."""
    digest = hashlib.sha256(gguf.read_bytes()).hexdigest()
    (root / "blobs").mkdir(parents=True)
    os.link(gguf, root / "blobs" / f"sha256-{digest}")
    (root / "blobs" / f"sha256-{'0' * 64}").symlink_to(gguf)
    for name, layer in (("smol", f"sha256:{digest}"), ("evil", str(gguf)),
                        ("link", f"sha256:{'0' * 64}")):
        path = root / "manifests/registry.ollama.ai/library" / name / "1"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"layers": [
            {"mediaType": "application/vnd.ollama.image.model", "digest": layer}]}))


def test_normal_users_see_model_names_not_paths(tmp_path: Path, in_thread_server: Any,
                                                monkeypatch: pytest.MonkeyPatch,
                                                idle_check: Any, waiter: Any) -> None:
    from web.access.users import UserStore

    gguf = default_gguf()
    assert gguf is not None
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    ollama_store(tmp_path / "ollama", gguf)
    extra, gone = tmp_path / "models" / "extra.gguf", tmp_path / "models" / "gone.gguf"
    extra.parent.mkdir()
    os.link(gguf, extra)
    os.link(gguf, gone)
    users = UserStore(get_paths().data / "users.json")
    tokens = {"ann": users.add("ann", admin=True), "bob": users.add("bob", admin=False)}
    settings = Settings(models=["default", str(extra), str(gone)], host="0.0.0.0",
                        max_running=2, kv_tokens=2048, default_max_tokens=4, keep_alive="0")
    refs, found = models_to_serve(settings)
    assert [f.name for f in found] == ["smol:1"]  # evil:1 and link:1 are never offered
    app, _, _, _ = build_several(settings, get_paths(), refs, progress=False, found=found)
    server = in_thread_server(app, None, "uvicorn-paths", 120)
    models = server.engine = app.state.services.engine
    ann, bob = (httpx.Client(base_url=server.url, timeout=120,
                             headers={"Authorization": f"Bearer {tokens[n]}"})
                for n in ("ann", "bob"))

    def chat(c: httpx.Client, model: str) -> httpx.Response:
        return c.post("/v1/chat/completions", json={
            "model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]})

    def cards(c: httpx.Client) -> dict[str, Any]:
        return {m["id"]: m for m in c.get("/v1/models").json()["data"]}

    try:
        waiter(lambda: "smol:1" in cards(ann), 60, message="smol:1 discovered")
        for name in ("evil:1", "link:1"):  # refused by the store: unknown to the server
            r = chat(bob, name)
            assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        assert chat(bob, "smol:1").status_code == 200  # the store's own file is served

        # a file gone before its tokenizer was ever opened: 503 naming the model
        gone.unlink()
        for c in (bob, ann):
            r = chat(c, "gone")
            assert r.status_code == 503, r.text
            error = r.json()["error"]
            assert error["code"] == "model_unavailable" and "gone" in error["message"]
            assert str(tmp_path) not in r.text

        html = {"Accept": "text/html"}
        # a file gone while its model is unloaded (the tokenizer open): the load fails
        assert chat(ann, "extra").status_code == 200  # loads, then unloads (keep_alive 0)
        waiter(lambda: cards(ann)["extra"]["state"] == "unloaded", 30, message="unload")
        extra.unlink()
        r = chat(bob, "extra")
        assert r.status_code == 503, r.text
        assert r.json()["error"] == {"message": "the model extra could not be loaded",
                                     "type": "server_error", "param": None,
                                     "code": "model_unavailable"}
        assert cards(bob)["extra"]["error"] == "the model extra could not be loaded"
        assert str(extra) in cards(ann)["extra"]["error"]  # the admin keeps the detail
        stream = bob.post("/v1/chat/completions", json={
            "model": "extra", "max_tokens": 2, "stream": True,
            "messages": [{"role": "user", "content": "Hi"}]})
        assert "the model extra could not be loaded" in stream.text
        assert str(tmp_path) not in stream.text

        # a chat with it: the reply fails, and its words name the model
        created = bob.post("/c", data={"content": "Hi", "model": "extra"})
        assert created.status_code == 303, created.text
        page = created.headers["location"]
        waiter(lambda: "could not be loaded" in bob.get(page, headers=html).text, 30,
               message="the failed reply")
        assert str(tmp_path) not in bob.get(page, headers=html).text

        # nothing bob reads names a file: the API, the dashboard, the chat page
        for text in (bob.get("/v1/models").text, bob.get("/dashboard", headers=html).text,
                     bob.get("/", headers=html).text):
            assert "extra" in text
            assert str(tmp_path) not in text and str(gguf.parent) not in text
        assert str(extra) in ann.get("/dashboard", headers=html).text  # the admin's board
        assert str(tmp_path / "ollama") in ann.get("/", headers=html).text  # picker titles
        deadline = time.monotonic() + 30
        while models.live_ids() and time.monotonic() < deadline:
            time.sleep(0.05)
        idle_check(models)
    finally:
        server.stop()
