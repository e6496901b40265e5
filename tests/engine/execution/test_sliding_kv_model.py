"""Sliding-window KV with a real model: a tiny seeded random Gemma 3 (window 8, pages of 4;
five local layers to one global) and Mistral (every layer local).

* logits equal transformers float32 through a long sequence: a prompt prefilled in chunks
  across several windows, then many decode rounds, while the local layers hold only the pages
  of their window (the harness releases them as the scheduler does);
* a long chat through the server: the engine snapshot and /metrics show the local layers
  holding no more than the window plus one round's new tokens, the global layers everything;
  the dashboard draws both bars; cancel returns every page of both kinds.
"""
from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from engine.config import EngineConfig
from engine.execution.executor import ModelExecutor
from tests.tools.random_hf import random_hf

VOCAB = 320
WINDOW = 8
PAGE = 4
CHUNK = 16
COMMON = {"vocab_size": VOCAB, "hidden_size": 128, "intermediate_size": 256,
          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 4096,
          "rms_norm_eps": 1e-6, "initializer_range": 0.05, "bos_token_id": 1,
          "eos_token_id": 2, "pad_token_id": 0}
CAP = -(-(WINDOW - 1 + CHUNK) // PAGE) + 1  # local pages one request may hold at once


def _config(family: str) -> object:
    from transformers import Gemma3TextConfig, MistralConfig

    if family == "gemma3":
        return Gemma3TextConfig(**COMMON, num_hidden_layers=6, head_dim=32,
                                query_pre_attn_scalar=32, sliding_window=WINDOW)
    return MistralConfig(**COMMON, num_hidden_layers=2, sliding_window=WINDOW,
                         tie_word_embeddings=False)


@pytest.fixture(scope="module", params=["gemma3", "mistral"])
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
          ) -> tuple[str, Path, torch.nn.Module]:
    hf = random_hf(_config(request.param))
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    return request.param, path, hf


def _prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB) for _ in range(n)]


def _executor(path: Path, config: EngineConfig) -> ModelExecutor:
    return ModelExecutor.from_pretrained(path, config, dtype=torch.float32, threads=1)


def test_long_sequence_matches_transformers_holding_the_window(
        model: tuple[str, Path, torch.nn.Module], kernels: str, make_harness: Any) -> None:
    """70 prompt tokens in chunks of 16 (beside a short request's decodes: mixed rounds), then
    150 decodes (220 positions, 27 windows): every logits row equals HF's, and no request
    holds more local pages than its window plus one round's tokens."""
    from tests.engine.execution.model.test_families import _compare

    name, path, hf = model
    h = make_harness(path, page_size=PAGE)
    ex = h.executor
    assert ex.local_pool is not None and ex.sliding_window == WINDOW
    assert ex.pool.num_layers == (1 if name == "gemma3" else 0)
    assert ex.local_pool.num_layers == (5 if name == "gemma3" else 2)
    long, short = h.new(_prompt(1, 70)), h.new(_prompt(2, 5))
    h.round([(short, 0, 5, True), (long, 0, CHUNK, False)])
    for start in range(CHUNK, 70, CHUNK):  # the short one decodes beside the chunks
        n = min(CHUNK, 70 - start)
        h.round([(long, start, n, start + n == 70),
                 (short, short.num_tokens - 1, 1, True)], "mixed")
        assert len(long.local_pages) <= CAP
    for _ in range(150):
        h.round([(r, r.num_tokens - 1, 1, True) for r in (long, short)], "decode")
        assert len(long.local_pages) <= -(-(WINDOW) // PAGE) + 1
    last = long.num_tokens - 2  # the last round's position
    assert long.local_first == (last - WINDOW + 1) // PAGE
    assert len(long.pages) == -(-(long.num_tokens - 1) // PAGE)  # the global layers: all
    _compare(h, hf, [long, short])


def _local_used(text: str, kind: str = "used") -> float:
    found = re.search(rf'^ferry:kv_cache_local_positions\{{[^}}]*kind="{kind}"[^}}]*\}} (\S+)',
                      text, re.M)
    assert found, "no local KV gauge"
    return float(found.group(1))


def _global_used(text: str) -> float:
    found = re.search(r'^ferry:kv_cache_positions\{[^}]*kind="used"[^}]*\} (\S+)', text, re.M)
    assert found
    return float(found.group(1))


def test_long_chat_holds_the_window_and_shows_it(
        model: tuple[str, Path, torch.nn.Module], make_server: Any, waiter: Any,
        idle_check: Any) -> None:
    """A long chat through the server, 4,096 positions on Gemma 3 (prompt 1,000 in chunks of
    16, 3,096 tokens out; Mistral 1,200): while it runs the snapshot and /metrics show the
    local layers holding at most CAP pages, the global ones the whole sequence; the dashboard
    draws both bars; then a cancelled one returns all pages of both kinds."""
    name, path, _ = model
    prompt, total = (1000, 4096) if name == "gemma3" else (200, 1200)
    fields: dict[str, Any] = {"page_size": PAGE, "max_prefill_tokens": CHUNK,
                              "kv_tokens": 8192, "max_context": 4096, "max_running": 4}
    executor = _executor(path, EngineConfig(**fields))
    server = make_server(executor=executor, **fields)
    engine = server.engine
    assert engine.config.sliding_window == WINDOW
    assert engine.snapshot().prefix_cache is False and engine.snapshot().speculative == "off"
    seen_local: list[float] = []
    with httpx.Client(base_url=server.url, timeout=120) as http:
        served = http.get("/v1/models").json()["data"][0]["id"]

        def long_request(max_tokens: int, seed: int) -> Any:
            return http.build_request("POST", "/v1/completions", json={
                "model": served, "prompt": _prompt(seed, prompt), "max_tokens": max_tokens,
                "ignore_eos": True, "temperature": 0, "stream": True})

        response = http.send(long_request(total - prompt, 3), stream=True)
        assert response.status_code == 200

        def deep() -> bool:
            snap = engine.snapshot()
            assert snap.local_kv is not None
            seen_local.append(snap.local_kv.used)
            return snap.kv.used >= total - 400

        waiter(deep, 600, message=f"the chat past {total - 400} positions")
        snap = engine.snapshot()
        metrics = http.get("/metrics").text
        board = http.get("/dashboard").text
        for _ in response.iter_lines():
            pass
        response.close()
        assert snap.local_kv is not None and snap.sliding_window == WINDOW
        assert max(seen_local) <= CAP * PAGE < snap.kv.used
        assert snap.local_kv.total == 4 * CAP * PAGE  # every slot's most
        assert 0 < _local_used(metrics) <= CAP * PAGE
        assert _global_used(metrics) >= total - 400
        assert 'id="kvbar-local"' in board and f"window {WINDOW}" in board
        assert 'class="stat-sub muted">local layers' in board
        idle_check(engine)
        done = engine.snapshot()
        assert done.local_kv is not None and done.local_kv.used == 0
        assert done.local_kv.free == done.local_kv.total
        assert _local_used(http.get("/metrics").text, "free") == done.local_kv.total

        # cancel mid-decode: pages of both kinds come back
        response = http.send(long_request(1000, 4), stream=True)
        waiter(lambda: engine.snapshot().kv.used >= prompt + 100, 300,
               message="the second chat")
        rid = engine.live_ids()[0]
        assert http.delete(f"/v1/requests/{rid}").status_code in (200, 204)
        response.close()
        idle_check(engine)
        done = engine.snapshot()
        assert done.local_kv is not None and done.local_kv.used == 0
        assert done.local_kv.free == done.local_kv.total and done.kv.used == 0
