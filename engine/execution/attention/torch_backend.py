"""Reference attention in plain torch: works on CPU and any device, batched per round.

No Python loop over sequences per layer. `prepare` builds, once per round, the index tensors
that gather every sequence's pages out of the pool (padded to the most pages in a group)
and the masks (one per distinct sliding window of the model's layers, and the full one);
each layer then does one gather for K and V together and batched matmuls:

* decode part (one query each): pages gathered as (K/V, page, head) blocks come out
  head-major, [seqs * kv_heads, L, d], so a GQA group of query heads is one `baddbmm` row
  block with the scale and padding mask fused in; softmax runs in float32. On CPU this beats
  SDPA (notably in bf16) for single-query attention.
* prefill part (several queries each): queries padded to [seqs, Qmax], SDPA with a bool mask,
  causal and aligned to each sequence's end (a chunk after a cached prefix sees the prefix);
  a span's rows (an image attended as a whole) see up to the span's last position.
Sequences of very different sizes go to separate groups (one call each; few per round), so
one long context does not make every short one pay for its padding.
Padded pages repeat a sequence's first page, so they hold finite values, and are masked out.

On CPU with Ferry's kernels loaded (engine.kernels), K/V are stored and the decode part is
attended by C kernels that read the pages in place (no gather copy, one call per layer);
so is a prefill part of few rows or short contexts (NATIVE_PREFILL_*), each query row as a
sequence of its own; longer ones keep SDPA (all of them the kernel under batch invariance,
engine.kernels.invariance). With a local layers' pool, all of this is planned
once per pool (`Plan`), over that pool's trimmed page tables, with the masks of that pool's
layers.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from engine.execution.attention.base import AttentionBackend, AttentionInputs, NativeDecode
from engine.execution.attention.torch_plan import (
    DecodeGroup,
    Plan,
    PrefillGroup,
    group_by_size,
)
from engine.execution.cpu import emulated_bf16
from engine.execution.kv_pool import KVPool
from engine.kernels import ops
from engine.kernels.invariance import batch_invariant

# a prefill part whose sequences each have at most NATIVE_PREFILL_ROWS query rows (a
# speculative round's) or at most NATIVE_PREFILL_CONTEXT positions (short prompts) is attended
# by the decode kernel straight from the pages, each query row as an entry of its own ending
# at its position (causal by construction; the kernel takes a sequence's rows in tiles of 8).
# SDPA over one gathered copy multiplies more rows at a time: many rows over a long context
# stay with it (the crossover measured is in docs/kernels.md, Thresholds).
NATIVE_PREFILL_ROWS = 32
NATIVE_PREFILL_CONTEXT = 512


class TorchAttention(AttentionBackend):
    name = "torch"

    def __init__(self, pool: KVPool, num_heads: int, num_kv_heads: int, head_dim: int,
                 scale: float, windows: Sequence[int | None] = (),
                 local_pool: KVPool | None = None) -> None:
        super().__init__(pool, num_heads, num_kv_heads, head_dim, scale, windows, local_pool)
        # the masks each pool's layers need: per distinct window, and the full one
        self.kinds: tuple[list[int | None], ...] = tuple(
            [None, *sorted({w for i, w in enumerate(self.windows)
                            if w and self.place(i)[2] == local})] for local in (False, True))
        # emulated bf16 batched matmuls fall back to one small addmm per matrix (far slower
        # than float32), and a CPU has no float16 arithmetic either: attend in float32 over
        # the gathered (already copied) K/V
        emulated = emulated_bf16(pool.dtype, pool.device) or (
            pool.dtype == torch.float16 and pool.device.type == "cpu")
        self.compute_dtype = torch.float32 if emulated else pool.dtype
        # Ferry's CPU kernels (engine.kernels) store K/V and attend single-token sequences
        # straight from the pages: no gather copy, one call per layer
        self.native = ops.usable_pool(pool.data) and (local_pool is None
                                                      or ops.usable_pool(local_pool.data))
        self.plans: tuple[Plan, ...] = ()

    def _block_index(self, pool: KVPool, page_tables: list[list[int]],
                     kv_lens: list[int]) -> tuple[torch.Tensor, int]:
        """Rows of the pool's block view holding each sequence's pages, ordered (K/V,
        sequence, head, page), padded with the first page -> (index, padded length)."""
        ps, kvh = pool.page_size, self.num_kv_heads
        num = max(-(-kv // ps) for kv in kv_lens)
        table = torch.tensor([pt[:num] + [pt[0]] * (num - len(pt[:num])) for pt in page_tables],
                             dtype=torch.int64, device="cpu")
        c = torch.arange(2, dtype=torch.int64, device="cpu")[:, None, None, None]
        heads = torch.arange(kvh, dtype=torch.int64, device="cpu")[None, None, :, None]
        index = (table[None, :, None, :] * 2 + c) * kvh + heads  # [2, n, kv_heads, pages]
        return index.flatten().to(pool.device), num * ps

    def prepare(self, inputs: AttentionInputs) -> None:
        n_dec = inputs.num_single
        self.n_dec, self.n_pre = n_dec, len(inputs.query_lens) - n_dec
        pools = [self.pool] if self.local_pool is None else [self.pool, self.local_pool]
        self.plans = tuple(self._plan(inputs, pool, i == 1) for i, pool in enumerate(pools))

    def _plan(self, inputs: AttentionInputs, pool: KVPool, local: bool) -> Plan:
        dev, kvh, n_dec = pool.device, self.num_kv_heads, self.n_dec
        kv_lens, page_tables, slot_mapping = inputs.part(local)
        plan = Plan(n_dec)
        if self.native:
            # the kernels trust their indices: check them once per round, not per layer
            plan.slots = slot_mapping
            slots = slot_mapping.tolist()  # a CPU tensor here: cheaper than two reductions
            if slots and not (min(slots) >= 0 and max(slots) < pool.num_slots):
                raise ValueError("slot_mapping points outside the KV pool")
            if n_dec:
                plan.dec_pages = ops.DecodePages(page_tables[:n_dec], kv_lens[:n_dec],
                                                 pool.page_size, pool.num_pages)
        else:
            plan.where = pool.locate(slot_mapping)
        if n_dec and not self.native:
            kvlens = kv_lens[:n_dec]
            groups = group_by_size([1] * n_dec, kvlens)
            for g in groups:
                kv = [kvlens[i] for i in g]
                idx, length = self._block_index(pool, [page_tables[i] for i in g], kv)
                k = torch.arange(length, device="cpu")[None, :]
                ends = torch.tensor(kv, device="cpu")[:, None]
                masks = {}
                for window in self.kinds[local]:
                    pad = (k >= ends) if window is None else (k >= ends) | (k < ends - window)
                    mask = torch.zeros(len(g), 1, length, dtype=self.compute_dtype,
                                       device="cpu")
                    mask.masked_fill_(pad[:, None, :], float("-inf"))
                    masks[window] = mask.repeat_interleave(kvh, dim=0).to(dev)  # [n*kvh, 1, L]
                q_idx = None if len(groups) == 1 else torch.tensor(g, device="cpu").to(dev)
                plan.dec_groups.append(DecodeGroup(len(g), length, idx, masks, q_idx))
            order = [i for g in groups for i in g]
            if order != list(range(n_dec)):
                plan.dec_perm = torch.argsort(torch.tensor(order, device="cpu")).to(dev)
        if self.n_pre:
            qlens, kvlens = inputs.query_lens[n_dec:], kv_lens[n_dec:]
            tables = page_tables[n_dec:]
            # spans: a prefill-part sequence -> its rows that see one another both ways
            spans: dict[int, list[tuple[int, int]]] = {}
            for seq, first, count in inputs.spans:
                if seq >= n_dec and count > 1:
                    spans.setdefault(seq - n_dec, []).append((first, count))
            # batch invariance: every row in the kernel, as it would be in any other chunk
            if self.native and not spans and (batch_invariant() or all(
                    q <= NATIVE_PREFILL_ROWS or kv <= NATIVE_PREFILL_CONTEXT
                    for q, kv in zip(qlens, kvlens))):
                plan.pre_pages = ops.DecodePages(  # a sequence's rows share its table
                    [t for t, q in zip(tables, qlens) for _ in range(q)],
                    [kv - q + r + 1 for q, kv in zip(qlens, kvlens) for r in range(q)],
                    pool.page_size, pool.num_pages)
                return plan
            firsts = [0]
            for q in qlens[:-1]:
                firsts.append(firsts[-1] + q)
            groups = group_by_size(qlens, kvlens)
            rows: list[int] = []  # prefill-part rows in the order the groups output them
            for g in groups:
                plan.pre_groups.append(self._prefill_group(
                    pool, self.kinds[local], [qlens[i] for i in g], [kvlens[i] for i in g],
                    [tables[i] for i in g], [firsts[i] for i in g],
                    whole=len(groups) == 1 and len(g) == 1,
                    spans=[spans.get(i, []) for i in g]))
                rows.extend(r for i in g for r in range(firsts[i], firsts[i] + qlens[i]))
            if rows != list(range(len(rows))):
                plan.pre_perm = torch.argsort(torch.tensor(rows, device="cpu")).to(dev)
        return plan

    def _prefill_group(self, pool: KVPool, kinds: list[int | None], qlens: list[int],
                       kvlens: list[int], tables: list[list[int]], firsts: list[int],
                       whole: bool, spans: Sequence[Sequence[tuple[int, int]]] = ()
                       ) -> PrefillGroup:
        dev = pool.device
        n, qmax = len(qlens), max(qlens)
        kv_idx, length = self._block_index(pool, tables, kvlens)
        ql = torch.tensor(qlens, dtype=torch.int64, device="cpu")
        i = torch.arange(qmax, dtype=torch.int64, device="cpu")[None, :]
        i_clamped = torch.minimum(i, ql[:, None] - 1)  # padded query rows copy the last
        # positions in the view
        qpos = torch.tensor(kvlens, device="cpu")[:, None] - ql[:, None] + i_clamped
        k = torch.arange(length, device="cpu")[None, None, :]
        upto = qpos.clone()  # the last position each row sees: its own, or its span's last
        for s, seq_spans in enumerate(spans):
            for first, rows in seq_spans:
                upto[s, first:first + rows] = qpos[s, first + rows - 1]
        causal = k <= upto[:, :, None]
        masks = {w: (causal if w is None else causal & (k > qpos[:, :, None] - w))
                 .unsqueeze(1).to(dev) for w in kinds}
        if whole:  # the only prefill sequence: no padding, use views
            return PrefillGroup(n, qmax, length, kv_idx, masks, None, None)
        q_idx = (torch.tensor(firsts, device="cpu")[:, None] + i_clamped).flatten().to(dev)
        out_idx = (torch.arange(n, device="cpu")[:, None] * qmax + i)[i < ql[:, None]].to(dev)
        return PrefillGroup(n, qmax, length, kv_idx, masks, q_idx, out_idx)

    def native_decode(self) -> NativeDecode | None:
        if not self.plans or self.plans[0].dec_pages is None or self.n_pre:
            return None
        glob = self.plans[0]
        assert glob.slots is not None and glob.dec_pages is not None
        if len(self.plans) == 1:
            return NativeDecode(glob.slots, glob.dec_pages)
        loc = self.plans[1]
        return NativeDecode(glob.slots, glob.dec_pages, loc.slots, loc.dec_pages)

    def forward(self, q: torch.Tensor, kv: torch.Tensor, layer: int) -> torch.Tensor:
        pool, index, local = self.place(layer)
        plan = self.plans[local]
        window = self.window(layer)
        parts = []
        if plan.slots is not None:
            ops.store_kv(kv, plan.slots, pool.paged(index))
        else:
            assert plan.where is not None
            pool.write(index, plan.where, kv)
        blocks = pool.blocks(index)
        if plan.dec_pages is not None:
            parts.append(ops.decode_attention(q[:self.n_dec], pool.paged(index),
                                              plan.dec_pages, self.scale, window))
        elif self.n_dec:
            qdec = q[:self.n_dec]
            outs = [self._decode(qdec, blocks, g, window) for g in plan.dec_groups]
            out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)
            if plan.dec_perm is not None:
                out = out.index_select(0, plan.dec_perm)
            parts.append(out)
        if plan.pre_pages is not None:
            parts.append(ops.decode_attention(q[self.n_dec:], pool.paged(index),
                                              plan.pre_pages, self.scale, window))
        elif self.n_pre:
            qpre = q[self.n_dec:]
            outs = [self._prefill(qpre, blocks, g, window) for g in plan.pre_groups]
            out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)
            if plan.pre_perm is not None:
                out = out.index_select(0, plan.pre_perm)
            parts.append(out)
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)

    def _decode(self, qdec: torch.Tensor, blocks: torch.Tensor, g: DecodeGroup,
                window: int | None) -> torch.Tensor:
        d, kvh, h = self.head_dim, self.num_kv_heads, self.num_heads
        qd = qdec if g.q_idx is None else qdec.index_select(0, g.q_idx)
        qd = qd.reshape(g.n * kvh, h // kvh, d).to(self.compute_dtype)
        kv = blocks.index_select(0, g.kv_idx).to(self.compute_dtype)
        kd, vd = kv.view(2, g.n * kvh, g.length, d)
        scores = torch.baddbmm(g.masks[window], qd, kd.transpose(1, 2), alpha=self.scale)
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(vd.dtype)
        return torch.bmm(probs, vd).view(g.n, h * d).to(qdec.dtype)

    def _prefill(self, qpre: torch.Tensor, blocks: torch.Tensor, g: PrefillGroup,
                 window: int | None) -> torch.Tensor:
        d, kvh, h = self.head_dim, self.num_kv_heads, self.num_heads
        qp = qpre if g.q_idx is None else qpre.index_select(0, g.q_idx)
        qp = qp.reshape(g.n, g.qmax, h, d).transpose(1, 2).to(self.compute_dtype)
        kv = blocks.index_select(0, g.kv_idx).to(self.compute_dtype)
        kp, vp = kv.view(2, g.n, kvh, g.length, d)
        out = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=g.masks[window],
                                             scale=self.scale, enable_gqa=kvh != h)
        out = out.transpose(1, 2).reshape(g.n * g.qmax, h * d).to(qpre.dtype)
        return out if g.out_idx is None else out.index_select(0, g.out_idx)
