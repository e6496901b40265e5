"""Perplexity through the API (echo + logprobs, max_tokens 0), llama.cpp's llama-perplexity
method: the text in chunks of 512 tokens, each scored on its second half. The float path
(the GGUF dequantized to float32) must match Hugging Face transformers on the same dequantized
weights to 0.1%; `--dtype auto` (the GGUF in its own blocks, where the build supports it) must
be within 1.5% of the float path. The text is the GNU GPL version 3, copied verbatim."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.model
MODEL = "SmolLM2-135M-Instruct"
TEXT = Path(__file__).parents[2] / "data" / "gpl-3.0.txt"
CHUNK = 512
CHUNKS = 4  # 2,048 tokens of the text, 1,024 of them scored


@pytest.fixture(scope="module")
def chunks(tokenizer: Any) -> list[list[int]]:
    ids = tokenizer.encode(TEXT.read_text(), add_special_tokens=False)
    assert len(ids) >= CHUNK * CHUNKS
    return [ids[i * CHUNK:(i + 1) * CHUNK] for i in range(CHUNKS)]


def nll_api(url: str, chunk: list[int]) -> list[float]:
    """-log p of the chunk's second-half tokens, as the server scores them."""
    r = httpx.post(url + "/v1/completions", timeout=300, json={
        "model": MODEL, "prompt": chunk, "echo": True, "logprobs": 0, "max_tokens": 0})
    assert r.status_code == 200, r.text
    scores = r.json()["choices"][0]["logprobs"]["token_logprobs"]
    assert len(scores) == len(chunk) and scores[0] is None
    return [-s for s in scores[CHUNK // 2:]]


def nll_hf(hf_model: Any, chunk: list[int]) -> list[float]:
    import torch
    with torch.inference_mode():
        logp = hf_model(torch.tensor([chunk])).logits[0].float().log_softmax(-1)
    rows = torch.arange(CHUNK // 2 - 1, CHUNK - 1)
    return (-logp[rows, torch.tensor(chunk[CHUNK // 2:])]).tolist()


def perplexity(nlls: list[list[float]]) -> float:
    flat = [x for chunk in nlls for x in chunk]
    return math.exp(sum(flat) / len(flat))


@pytest.mark.timeout(900)  # three full passes over the text; slow on a busy machine
def test_perplexity_float_matches_transformers_and_auto_is_close(
        make_server: Any, model_dir: Path, chunks: list[list[int]], hf_model: Any,
        idle_check: Any) -> None:
    from engine import EngineConfig, ModelExecutor
    float_server = make_server(max_running=2)
    ppl_float = perplexity([nll_api(float_server.url, c) for c in chunks])
    idle_check(float_server.engine)
    float_server.stop()  # one model's weights in memory at a time

    ppl_hf = perplexity([nll_hf(hf_model, c) for c in chunks])

    config = EngineConfig(kv_tokens=8192, max_context=2048, max_running=2)
    auto = ModelExecutor.from_pretrained(model_dir, config, dtype="auto", progress=False)
    auto_server = make_server(executor=auto, max_running=2)
    ppl_auto = perplexity([nll_api(auto_server.url, c) for c in chunks])
    idle_check(auto_server.engine)

    print(f"\nperplexity over {CHUNKS} x {CHUNK} tokens (second halves): transformers "
          f"{ppl_hf:.4f}, float32 {ppl_float:.4f} ({ppl_float / ppl_hf - 1:+.4%}), auto "
          f"({auto.dtype}) {ppl_auto:.4f} ({ppl_auto / ppl_float - 1:+.4%} vs float32)")
    assert 1.0 < ppl_hf < 100.0  # an English text the model reads: sane, not uniform
    assert abs(ppl_float / ppl_hf - 1) < 0.001
    assert abs(ppl_auto / ppl_float - 1) < 0.015
