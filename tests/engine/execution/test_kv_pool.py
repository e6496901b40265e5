"""KV pool addressing and the attention inputs' invariants."""
from __future__ import annotations

import pytest
import torch

from engine.execution.attention.base import AttentionInputs
from engine.execution.kv_pool import KVPool, slot_of


def test_slot_formula_and_round_trip() -> None:
    pool = KVPool(2, num_pages=6, page_size=4, num_kv_heads=2, head_dim=3,
                  dtype=torch.float32, device="cpu")
    pages = [5, 0, 3]
    assert [slot_of(pages, p, 4) for p in (0, 3, 4, 9)] == [20, 23, 0, 13]
    slots = torch.tensor([slot_of(pages, p, 4) for p in range(10)])
    kv = torch.randn(10, 2, 2, 3)  # [tokens, K/V, kv_heads, head_dim]
    pool.write(1, pool.locate(slots), kv)
    assert torch.equal(pool.read(1, slots), kv)
    assert pool.read(0, slots).abs().sum() == 0  # other layers untouched
    paged = pool.paged(1)
    assert paged.shape == (6, 2, 2, 4, 3)  # [pages, K/V, kv_heads, page_size, head_dim]
    assert torch.equal(paged[3, 1, 1, 1], kv[9, 1, 1])  # position 9 -> page 3, offset 1
    row = (3 * 2 + 1) * 2 + 1  # block row of page 3, V, head 1
    assert torch.equal(pool.blocks(1)[row].view(4, 3)[1], kv[9, 1, 1])
    assert KVPool.bytes_per_token(30, 3, 64, torch.bfloat16) == 30 * 2 * 3 * 64 * 2


def test_attention_inputs_validation() -> None:
    slots = torch.zeros(3, dtype=torch.int64)
    AttentionInputs([1, 2], [5, 2], [[0, 1], [2]], slots)
    with pytest.raises(ValueError, match="single-token"):
        AttentionInputs([2, 1], [2, 5], [[2], [0, 1]], slots)
    with pytest.raises(ValueError, match="bad sequence"):
        AttentionInputs([3], [2], [[0]], slots)


def test_prefill_groups_limit_padding() -> None:
    from engine.execution.attention.torch_plan import group_by_size

    assert group_by_size([400, 30, 30, 30, 22], [400, 30, 30, 30, 22]) == [[0], [1, 2, 3, 4]]
    assert group_by_size([112, 112, 64], [112, 112, 64]) == [[0, 1, 2]]
    assert group_by_size([8, 8], [8, 300]) == [[1], [0]]  # a cached prefix counts as work
    groups = group_by_size(list(range(2, 40)), list(range(2, 40)))
    assert sorted(i for g in groups for i in g) == list(range(38)) and len(groups) > 1
