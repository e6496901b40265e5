"""Our decoder over the paged pool vs Hugging Face on the same weights (float32).

Whatever the batch composition, chunking or prefix sharing, logits must match HF's full-sequence
forward and greedy tokens must be identical.
"""
from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

VOCAB = 320


def prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, VOCAB) for _ in range(n)]


def test_single_request(tiny, harness, check) -> None:
    req = harness.new(prompt(random.Random(1), 7))
    harness.prefill([req])
    harness.decode([req], 8)
    check(tiny, harness, [req])


def test_batch_of_16_different_lengths(tiny, harness, check) -> None:
    rng = random.Random(2)
    reqs = [harness.new(prompt(rng, n)) for n in rng.sample(range(1, 41), 16)]
    harness.prefill(reqs)
    harness.decode(reqs, 4)
    check(tiny, harness, reqs)


def test_chunked_prefill(tiny, harness, check) -> None:
    rng = random.Random(3)
    req = harness.new(prompt(rng, 30))
    other = harness.new(prompt(rng, 11))
    harness.round([(req, 0, 7, False), (other, 0, 11, True)])
    harness.round([(other, 11, 1, True), (req, 7, 13, False)], "mixed")  # decode + chunk
    harness.round([(req, 20, 10, True)])  # last chunk samples
    harness.decode([req, other], 3)
    check(tiny, harness, [req, other])


def test_prefix_hit_shares_pages(tiny, harness, check) -> None:
    rng = random.Random(4)
    ps = harness.page_size
    common = prompt(rng, 3 * ps)
    first = harness.new(common + prompt(rng, 5))
    harness.prefill([first])
    harness.decode([first], 2)
    shared = first.pages[:3]
    second = harness.new(common + prompt(rng, 6), shared_pages=shared)
    third = harness.new(common[:2 * ps] + prompt(rng, 3), shared_pages=shared[:2])
    # the cached prefix is not recomputed: both start after their shared whole pages
    harness.round([(second, 3 * ps, 6, True), (third, 2 * ps, 3, True)])
    harness.decode([first, second, third], 3)
    assert second.pages[:3] == first.pages[:3]
    check(tiny, harness, [first, second, third])


def test_mixed_decode_and_prefill(tiny, harness, check) -> None:
    rng = random.Random(5)
    old = [harness.new(prompt(rng, n)) for n in (5, 9, 14)]
    harness.prefill(old)
    new = [harness.new(prompt(rng, n)) for n in (1, 6, 17)]
    for _ in range(2):
        work = [(r, r.num_tokens - 1, 1, True) for r in old]
        if new[0].num_outputs == 0:  # first pass: prefills ride along (one is 1 token long)
            work = [(r, 0, r.prompt_len, True) for r in new] + work
        else:
            work += [(r, r.num_tokens - 1, 1, True) for r in new]
        harness.round(work, "mixed")
    harness.decode(old + new, 2)
    check(tiny, harness, old + new)


def test_run_returns_greedy_tokens(tiny, harness, check) -> None:
    rng = random.Random(6)
    reqs = [harness.new(prompt(rng, n)) for n in (4, 12)]
    tokens = harness.round([(reqs[0], 0, 4, True), (reqs[1], 0, 5, False)], use_run=True)
    assert tokens[1] is None and isinstance(tokens[0], int)
    harness.round([(reqs[1], 5, 7, True)], use_run=True)
    for _ in range(5):
        harness.round([(r, r.num_tokens - 1, 1, True) for r in reqs], "decode", use_run=True)
    for r in reqs:
        ref = tiny.hf_logits(r.prompt_ids + r.output_ids)
        assert r.output_ids == ref[r.prompt_len - 1:-1].argmax(-1).tolist()


@pytest.mark.parametrize("page_size", [1, 16])
def test_page_sizes(tiny_models, make_harness, check, page_size: int) -> None:
    tiny = tiny_models["qwen3"]
    h = make_harness(tiny.path, page_size=page_size)
    rng = random.Random(7)
    reqs = [h.new(prompt(rng, n)) for n in (3, 20, 33)]
    h.prefill(reqs)
    h.decode(reqs, 3)
    check(tiny, h, reqs)


def test_bfloat16_close_to_float32(tiny_models, make_harness) -> None:
    tiny = tiny_models["llama"]
    h32 = make_harness(tiny.path)
    h16 = make_harness(tiny.path, dtype=torch.bfloat16)
    rng = random.Random(8)
    p = prompt(rng, 12)
    a, b = h32.new(p), h16.new(p)
    h32.prefill([a])
    h16.prefill([b])
    x, y = h32.logits[a.id][11], h16.logits[b.id][11].float()
    assert torch.nn.functional.cosine_similarity(x, y, dim=0) > 0.99


def test_bfloat16_batched_decode_close_to_float32(tiny_models, make_harness) -> None:
    """bf16 weights in a batch of 8 (widened float32 products on CPUs without bf16
    arithmetic) and of 2 (bf16 products) stay close to float32 through prefill and decode."""
    tiny = tiny_models["qwen2"]
    rng = random.Random(9)
    prompts = [prompt(rng, n) for n in (5, 9, 14, 3, 20, 7, 11, 6)]
    for size in (8, 2):
        h32, h16 = make_harness(tiny.path), make_harness(tiny.path, dtype=torch.bfloat16)
        a = [h32.new(p) for p in prompts[:size]]
        b = [h16.new(p) for p in prompts[:size]]
        h32.prefill(a)
        h16.prefill(b)
        for ra, rb in zip(a, b):  # decode the same tokens, so positions line up
            rb.output_ids = list(ra.output_ids)
        h32.decode(a, 1)
        h16.round([(r, r.num_tokens - 1, 1, True) for r in b], "decode")
        for ra, rb in zip(a, b):
            for pos, row in h32.logits[ra.id].items():
                cos = F.cosine_similarity(row, h16.logits[rb.id][pos], dim=0)
                assert cos > 0.99, (size, ra.id, pos, float(cos))
