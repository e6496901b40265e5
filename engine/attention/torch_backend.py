"""Reference attention in plain torch: works on CPU and any device, batched per round.

No Python loop over sequences per layer. `prepare` builds, once per round, the index tensors
that gather every sequence's pages out of the pool (padded to the most pages in the round)
and the masks; each layer then does one gather per K/V and batched matmuls:

* decode part (one query each): pages gathered as (page, head) blocks come out head-major,
  [seqs * kv_heads, L, d], so a GQA group of query heads is one `baddbmm` row block with the
  scale and padding mask fused in; softmax runs in float32. On CPU this beats SDPA (notably
  in bf16) for single-query attention.
* prefill part (several queries each): queries padded to [seqs, Qmax], SDPA with a bool mask,
  causal and aligned to each sequence's end (a chunk after a cached prefix sees the prefix).
Padded pages repeat a sequence's first page, so they hold finite values, and are masked out.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.attention.base import AttentionBackend, AttentionInputs


class TorchAttention(AttentionBackend):
    name = "torch"

    def _block_index(self, page_tables: list[list[int]],
                     kv_lens: list[int]) -> tuple[torch.Tensor, int]:
        """Rows of the pool's block view holding each sequence's pages, ordered (K/V,
        sequence, head, page), padded with the first page -> (index, padded length)."""
        ps, kvh = self.pool.page_size, self.num_kv_heads
        num = max(-(-kv // ps) for kv in kv_lens)
        table = torch.tensor([pt[:num] + [pt[0]] * (num - len(pt[:num])) for pt in page_tables],
                             dtype=torch.int64)
        c = torch.arange(2, dtype=torch.int64)[:, None, None, None]
        heads = torch.arange(kvh, dtype=torch.int64)[None, None, :, None]
        index = (table[None, :, None, :] * 2 + c) * kvh + heads  # [2, n, kv_heads, pages]
        return index.flatten().to(self.pool.device), num * ps

    def prepare(self, inputs: AttentionInputs) -> None:
        dev, kvh = self.pool.device, self.num_kv_heads
        self.where = self.pool.locate(inputs.slot_mapping)
        n_dec = inputs.num_single
        self.n_dec, self.n_pre = n_dec, len(inputs.query_lens) - n_dec
        if n_dec:
            kv = inputs.kv_lens[:n_dec]
            self.dec_idx, length = self._block_index(inputs.page_tables[:n_dec], kv)
            self.dec_len = length
            pad = torch.arange(length)[None, :] >= torch.tensor(kv)[:, None]
            mask = torch.zeros(n_dec, 1, length, dtype=self.pool.dtype)
            mask.masked_fill_(pad[:, None, :], float("-inf"))
            self.dec_mask = mask.repeat_interleave(kvh, dim=0).to(dev)  # [n*kvh, 1, L]
        if self.n_pre:
            qlens, kv = inputs.query_lens[n_dec:], inputs.kv_lens[n_dec:]
            n, qmax = self.n_pre, max(qlens)
            self.pre_idx, length = self._block_index(inputs.page_tables[n_dec:], kv)
            self.pre_len, self.pre_qmax = length, qmax
            ql = torch.tensor(qlens, dtype=torch.int64)
            first = torch.cumsum(ql, 0) - ql  # each sequence's first row in the prefill part
            i = torch.arange(qmax, dtype=torch.int64)[None, :]
            i_clamped = torch.minimum(i, ql[:, None] - 1)  # padded query rows copy the last
            qpos = torch.tensor(kv)[:, None] - ql[:, None] + i_clamped  # absolute positions
            self.pre_mask = (torch.arange(length)[None, None, :] <= qpos[:, :, None]
                             ).unsqueeze(1).to(dev)  # [n, 1, Qmax, L]
            if n == 1:
                self.pre_q_idx = self.pre_out_idx = None  # no padding: use views
            else:
                self.pre_q_idx = (first[:, None] + i_clamped).flatten().to(dev)
                real = i < ql[:, None]
                self.pre_out_idx = (torch.arange(n)[:, None] * qmax + i)[real].to(dev)

    def forward(self, q: torch.Tensor, kv: torch.Tensor, layer: int) -> torch.Tensor:
        self.pool.write(layer, self.where, kv)
        blocks = self.pool.blocks(layer)
        d, kvh, h = self.head_dim, self.num_kv_heads, self.num_heads
        parts = []
        if self.n_dec:
            n, length = self.n_dec, self.dec_len
            qd = q[:n].reshape(n * kvh, h // kvh, d)
            kd, vd = blocks.index_select(0, self.dec_idx).view(2, n * kvh, length, d)
            scores = torch.baddbmm(self.dec_mask, qd, kd.transpose(1, 2), alpha=self.scale)
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(vd.dtype)
            parts.append(torch.bmm(probs, vd).view(n, h * d))
        if self.n_pre:
            n, length, qmax = self.n_pre, self.pre_len, self.pre_qmax
            qp = q[self.n_dec:]
            if self.pre_q_idx is not None:
                qp = qp.index_select(0, self.pre_q_idx)
            qp = qp.reshape(n, qmax, h, d).transpose(1, 2)
            kp, vp = blocks.index_select(0, self.pre_idx).view(2, n, kvh, length, d)
            out = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=self.pre_mask,
                                                 scale=self.scale, enable_gqa=kvh != h)
            out = out.transpose(1, 2).reshape(n * qmax, h * d)
            if self.pre_out_idx is not None:
                out = out.index_select(0, self.pre_out_idx)
            parts.append(out)
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
