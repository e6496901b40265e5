"""Token sampling per request: greedy, temperature, top-k, top-p, reproducible seeds.

Greedy rows take one argmax over the whole batch. Sampled rows are processed together:
temperature is a per-row divide; top-k/top-p work on one sort (or one top-k when every row
has a top_k) with per-row masks; the draw is an inverse-CDF lookup of one uniform number per
row. That number comes from the request's own `torch.Generator` (seeded with `seed`, else
randomly), kept on the CPU so a seed gives the same tokens whatever the batch and device.
"""
from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from engine.kernels import ops
from engine.scheduling.request import SamplingParams


class Sampler:
    def __init__(self) -> None:
        self._generators: dict[str, torch.Generator] = {}

    def generator(self, key: str, seed: int | None) -> torch.Generator:
        gen = self._generators.get(key)
        if gen is None:
            gen = torch.Generator(device="cpu")
            gen.manual_seed(seed if seed is not None else int.from_bytes(os.urandom(8)) >> 1)
            self._generators[key] = gen
        return gen

    def release(self, key: str) -> None:
        self._generators.pop(key, None)

    def __len__(self) -> int:
        return len(self._generators)

    def sample(self, logits: torch.Tensor, params: Sequence[SamplingParams],
               keys: Sequence[str]) -> list[int]:
        """logits [S, vocab] -> one token per row, row i sampled with params[i]."""
        if logits.shape[0] == 0:
            return []
        rows = [i for i, p in enumerate(params) if not p.greedy]
        if len(rows) == len(params):
            out = [0] * len(params)
        else:  # Ferry's kernel where it can: torch's argmax is slow on bf16 CPU logits
            out = ops.argmax(logits) if ops.usable(logits) else logits.argmax(dim=-1).tolist()
        if rows:
            sub = logits[rows] if len(rows) < len(params) else logits
            picked = self._sample_rows(sub.float(), [params[i] for i in rows],
                                       [keys[i] for i in rows])
            for i, tok in zip(rows, picked):
                out[i] = tok
        return out

    def _sample_rows(self, logits: torch.Tensor, params: list[SamplingParams],
                     keys: list[str]) -> list[int]:
        dev = logits.device
        temps = torch.tensor([p.temperature for p in params], device=dev)
        logits = logits / temps[:, None]
        u = torch.cat([torch.rand(1, generator=self.generator(k, p.seed), device="cpu")
                       for k, p in zip(keys, params)]).to(dev, non_blocking=True)
        if all(p.top_k == 0 and p.top_p >= 1.0 for p in params):
            # no filter: inverse CDF over the vocabulary in its own order, no sort needed
            cdf = torch.softmax(logits, dim=-1).cumsum(dim=-1)
            idx = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)
            return idx.clamp_(max=logits.shape[1] - 1).squeeze(1).tolist()
        vocab = logits.shape[1]
        if all(p.top_k > 0 for p in params):
            vals, order = torch.topk(logits, min(max(p.top_k for p in params), vocab), dim=-1)
        else:
            vals, order = torch.sort(logits, dim=-1, descending=True)
        width = vals.shape[1]
        ks = torch.tensor([p.top_k if p.top_k > 0 else width for p in params], device=dev)
        rank = torch.arange(width, device=dev)
        vals = vals.masked_fill(rank[None, :] >= ks[:, None], float("-inf"))
        probs = torch.softmax(vals, dim=-1)
        # top-p (HF semantics): keep a token while the mass ranked strictly above it < top_p
        top_p = torch.tensor([p.top_p for p in params], device=dev)
        keep = (probs.cumsum(dim=-1) - probs) < top_p[:, None]
        keep[:, 0] = True
        cdf = (probs * keep).cumsum(dim=-1)
        idx = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)
        idx.clamp_(max=width - 1)
        return order.gather(1, idx).squeeze(1).tolist()
