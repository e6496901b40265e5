"""`ferry serve` with a model whose layers have a sliding window (a synthetic Mistral-style
GGUF: every layer windowed): the engine keeps the local layers' window only and turns the
prefix cache off, and the banner and /v1/models say so; a chat runs and gives back every page
of both pools."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from gguf import GGMLQuantizationType

from app import banner
from app.models import resolve_model
from app.paths import get_paths
from app.serve import build
from app.settings import Settings
from tests.tools import synthetic_gguf

pytestmark = pytest.mark.usefixtures("ferry_home")


def test_serve_names_the_sliding_window_kv(tmp_path: Path, in_thread_server: Any,
                                           idle_check: Any) -> None:
    path = tmp_path / "windowed.gguf"
    synthetic_gguf.write(path, hidden=64, layers=2, ff=128, heads=4, kv_heads=2,
                         qtype=GGMLQuantizationType.F16, untied=False, window=32)
    settings = Settings(model=str(path), max_running=2, kv_tokens=2048, page_size=16,
                        max_prefill_tokens=64, default_max_tokens=12, chat_temperature=0.0)
    assert settings.prefix_cache  # asked for, but not possible with local layers
    model = resolve_model(str(path))
    app, device, runs, template = build(settings, get_paths(), model, progress=False)
    # 2 slots x (ceil((32 - 1 + 64) / 16) + 1 = 7 pages of 16)
    assert "sliding-window KV: local layers keep 32 positions (224 in their pool), " \
           "prefix cache off" in runs
    assert runs in banner.banner(settings, model.name, device, runs, template)
    server = in_thread_server(app, None, "uvicorn-sliding", 120)
    engine = server.engine = app.state.services.engine  # made by the app's lifespan
    try:
        assert engine.config.sliding_window == 32 and not engine.snapshot().prefix_cache
        card = httpx.get(server.url + "/v1/models", timeout=10).json()["data"][0]
        assert "sliding-window KV" in card["runs"]
        body = {"model": model.name, "max_tokens": 40, "temperature": 0, "ignore_eos": True,
                "prompt": "word " * 90}
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 40
        idle_check(engine)
        snap = engine.snapshot()
        assert snap.local_kv is not None and snap.local_kv.total == 224
        assert snap.local_kv.used == 0 and snap.local_kv.free == 224
    finally:
        server.stop()
