"""The torch backend's per-round index structures: groups of sequences gathered and attended
together (padded to their longest), and one round's plan over one pool."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.kernels import ops

PAD_WASTE = 1.5  # a prefill group's padded attention work may be at most this x the real work


@dataclass(slots=True)
class DecodeGroup:
    n: int
    length: int  # padded KV length
    kv_idx: torch.Tensor
    masks: dict[int | None, torch.Tensor]  # per window: [n * kv_heads, 1, length] additive
    q_idx: torch.Tensor | None  # rows of the decode part; None = all, in order


@dataclass(slots=True)
class PrefillGroup:
    n: int
    qmax: int
    length: int  # padded KV length
    kv_idx: torch.Tensor
    masks: dict[int | None, torch.Tensor]  # per window: [n, 1, qmax, length] bool
    q_idx: torch.Tensor | None  # rows of the prefill part, padded; None = take it as is
    out_idx: torch.Tensor | None  # real rows of the padded output; None = all


def group_by_size(qlens: list[int], kvlens: list[int]) -> list[list[int]]:
    """Split sequences (indices) into groups whose padded work n * Qmax * Lmax stays within
    PAD_WASTE x their real work sum(q * kv); biggest first, greedy."""
    order = sorted(range(len(qlens)), key=lambda i: (-qlens[i] * kvlens[i], i))
    groups: list[list[int]] = []
    real = qmax = lmax = 0
    for i in order:
        q, kv = qlens[i], kvlens[i]
        if groups:
            n = len(groups[-1]) + 1
            padded = n * max(qmax, q) * max(lmax, kv)
            if padded <= PAD_WASTE * (real + q * kv):
                groups[-1].append(i)
                real, qmax, lmax = real + q * kv, max(qmax, q), max(lmax, kv)
                continue
        groups.append([i])
        real, qmax, lmax = q * kv, q, kv
    return [sorted(g) for g in groups]


@dataclass(slots=True)
class Plan:
    """One round's index tensors over one pool (the global or the local layers')."""

    n_dec: int
    slots: torch.Tensor | None = None  # native: checked slot_mapping
    where: tuple[torch.Tensor, torch.Tensor] | None = None  # torch: locate(slot_mapping)
    dec_pages: ops.DecodePages | None = None
    dec_groups: list[DecodeGroup] = field(default_factory=list)
    dec_perm: torch.Tensor | None = None
    pre_groups: list[PrefillGroup] = field(default_factory=list)
    pre_perm: torch.Tensor | None = None
    pre_pages: ops.DecodePages | None = None  # native: one entry per prefill query row
