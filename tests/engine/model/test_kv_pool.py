"""KV pool addressing and the attention inputs' invariants."""
from __future__ import annotations

import pytest
import torch

from engine.attention.base import AttentionInputs
from engine.kv_pool import KVPool, slot_of


def test_slot_formula_and_round_trip() -> None:
    pool = KVPool(2, num_pages=6, page_size=4, num_kv_heads=2, head_dim=3,
                  dtype=torch.float32, device="cpu")
    pages = [5, 0, 3]
    assert [slot_of(pages, p, 4) for p in (0, 3, 4, 9)] == [20, 23, 0, 13]
    slots = torch.tensor([slot_of(pages, p, 4) for p in range(10)])
    k, v = torch.randn(10, 2, 3), torch.randn(10, 2, 3)
    pool.write(1, pool.write_index(slots), k, v)
    rk, rv = pool.read(1, slots)
    assert torch.equal(rk, k) and torch.equal(rv, v)
    assert pool.read(0, slots)[0].abs().sum() == 0  # other layers untouched
    kp, _ = pool.paged(1)
    assert kp.shape == (6, 2, 4, 3)  # [pages, kv_heads, page_size, head_dim]
    assert torch.equal(kp[3, 1, 1], k[9, 1])  # position 9 -> page 3, offset 1
    assert KVPool.bytes_per_token(30, 3, 64, torch.bfloat16) == 30 * 2 * 3 * 64 * 2


def test_attention_inputs_validation() -> None:
    slots = torch.zeros(3, dtype=torch.int64)
    AttentionInputs([1, 2], [5, 2], [[0, 1], [2]], slots)
    with pytest.raises(ValueError, match="single-token"):
        AttentionInputs([2, 1], [2, 5], [[2], [0, 1]], slots)
    with pytest.raises(ValueError, match="bad sequence"):
        AttentionInputs([3], [2], [[0]], slots)
