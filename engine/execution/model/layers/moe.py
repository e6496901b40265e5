"""The mixture-of-experts MLP (Qwen3-MoE): a router picks `top_k` experts per token (softmax
over all, the top weights renormalised where the config says so), each expert a gated MLP.

Tokens are batched by expert: each chosen expert multiplies just the rows of the tokens that
chose it, so a quantized expert's blocks are read only when some token in the round chose it
(its weights are views into the file's map, one per expert). A single row (one chat's decode
step) runs its top_k experts directly, with no sorting or gathering.
"""
from __future__ import annotations

import torch
from torch import nn

from engine.execution.model.config import MoESpec
from engine.execution.model.layers.linear import Linear
from engine.execution.model.layers.mlp import GatedMLP


class MoEMLP(nn.Module):
    def __init__(self, hidden: int, spec: MoESpec, act: str, dtype: torch.dtype,
                 device: torch.device | str | None) -> None:
        super().__init__()
        self.spec = spec
        self.gate = Linear(hidden, spec.experts, False, dtype, device)  # the router
        self.experts = nn.ModuleList(GatedMLP(hidden, spec.intermediate_size, act, False,
                                              dtype, device) for _ in range(spec.experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]."""
        probs = torch.softmax(self.gate(x), dim=-1, dtype=torch.float32)  # [T, experts]
        weights, chosen = torch.topk(probs, self.spec.top_k, dim=-1)  # [T, top_k]
        if self.spec.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = weights.to(x.dtype)
        if x.shape[0] == 1:  # one sequence's decode step: its top_k experts in turn
            out: torch.Tensor | None = None
            for w, expert in zip(weights[0].tolist(), chosen[0].tolist(), strict=True):
                y: torch.Tensor = self.experts[expert](x).mul_(w)
                out = y if out is None else out.add_(y)
            assert out is not None
            return out
        # (token, slot) pairs sorted by expert: one gather of the rows, one product per
        # expert chosen on a contiguous slice, one gather back; per-expert index_add_ calls
        # cost more than the products at a few rows each (32 chats over 32 experts)
        flat = chosen.flatten()
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.spec.experts).tolist()
        rows = x.index_select(0, order // self.spec.top_k)
        ys = torch.empty_like(rows)
        start = 0
        for expert, n in enumerate(counts):
            if n:
                ys[start:start + n] = self.experts[expert](rows[start:start + n])
                start += n
        ys.mul_(weights.flatten().index_select(0, order)[:, None])
        back = ys.index_select(0, torch.argsort(order))  # (token, slot) order again
        return back.view(x.shape[0], self.spec.top_k, x.shape[1]).sum(dim=1)
