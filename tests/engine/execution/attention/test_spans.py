"""Rows that attend to one another both ways (an image Gemma 3 attends as a whole): the
torch backend's prefill against a dense reference written out per position, in a round
that mixes a decode, a chunk after a prefix already in the pool, and a fresh prompt, with a
sliding-window layer beside a global one."""
from __future__ import annotations

import pytest
import torch

from engine.execution.attention.base import AttentionInputs
from engine.execution.attention.torch_backend import TorchAttention
from engine.execution.kv_pool import KVPool, slot_of

HEADS, KV_HEADS, D, PAGE = 4, 2, 16, 4
WINDOWS = (6, None)  # layer 0 slides over its last 6 positions, layer 1 sees all


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: list[int],
              span: tuple[int, int] | None, window: int | None) -> torch.Tensor:
    """q [rows, heads, d] at `positions`, k/v [kv, kv_heads, d] for positions 0..kv-1: each
    row sees its own and earlier positions (the last `window` of them), and the whole of
    [span) when it lies in it."""
    out = []
    group = HEADS // KV_HEADS
    for r, p in enumerate(positions):
        keys = torch.arange(k.shape[0])
        seen = keys <= p
        if window is not None:
            seen &= keys > p - window
        if span is not None and span[0] <= p < span[1]:
            seen |= (keys >= span[0]) & (keys < span[1])
        kr = k[seen].repeat_interleave(group, dim=1)  # [n, heads, d]
        vr = v[seen].repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[r], kr) * D ** -0.5
        out.append(torch.einsum("hn,nhd->hd", scores.softmax(-1), vr).reshape(-1))
    return torch.stack(out)


@pytest.mark.parametrize("native", [True, False])
def test_span_rows_see_their_whole_span(native: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    # (positions before this round, new positions, span of new positions or None)
    seqs = [(9, 1, None), (8, 12, (10, 16)), (0, 14, (3, 9))]
    pool = KVPool(2, 32, PAGE, KV_HEADS, D, torch.float32, "cpu")
    attn = TorchAttention(pool, HEADS, KV_HEADS, D, D ** -0.5, WINDOWS)
    attn.native = native and attn.native
    tables, next_page, slots, spans = [], 0, [], []
    full_k, full_v = [], []
    for i, (before, new, span) in enumerate(seqs):
        total = before + new
        pages = list(range(next_page, next_page + -(-total // PAGE)))
        next_page += len(pages)
        tables.append(pages)
        k = torch.randn(total, KV_HEADS, D, generator=gen)
        v = torch.randn(total, KV_HEADS, D, generator=gen)
        full_k.append(k)
        full_v.append(v)
        for layer in range(2):  # the earlier positions are in the pool already
            for p in range(before):
                pool.data[layer, pages[p // PAGE], 0, :, p % PAGE] = k[p]
                pool.data[layer, pages[p // PAGE], 1, :, p % PAGE] = v[p]
        slots += [slot_of(pages, p, PAGE) for p in range(before, total)]
        if span is not None:
            spans.append((i, span[0] - before, span[1] - span[0]))
    inputs = AttentionInputs([n for _, n, _ in seqs], [b + n for b, n, _ in seqs], tables,
                             torch.tensor(slots), spans=tuple(spans))
    attn.prepare(inputs)
    q = torch.randn(len(slots), HEADS, D, generator=gen)
    kv = torch.cat([torch.stack([k[b:], v[b:]], dim=1)
                    for (b, _, _), k, v in zip(seqs, full_k, full_v)])
    for layer, window in enumerate(WINDOWS):
        got = attn.forward(q, kv, layer)
        row = 0
        for (before, new, span), k, v in zip(seqs, full_k, full_v):
            want = reference(q[row:row + new], k, v, list(range(before, before + new)), span,
                             window)
            torch.testing.assert_close(got[row:row + new], want, atol=1e-5, rtol=1e-5)
            row += new


@pytest.mark.parametrize("span", [(0, -1, 1), (0, 1, 1), (1, 0, 3), (2, 0, 1), (1, 1, 0)])
def test_bad_spans_are_refused(span: tuple[int, int, int]) -> None:
    with pytest.raises(ValueError, match="bad span"):
        AttentionInputs([1, 2], [1, 2], [[0], [1]], torch.tensor([0, 4, 5]), spans=(span,))
