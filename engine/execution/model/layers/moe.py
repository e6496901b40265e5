"""The mixture-of-experts MLP (Qwen3-MoE): a router picks `top_k` experts per token (softmax
over all, the top weights renormalised where the config says so), each expert a gated MLP.

Tokens are batched by expert: each chosen expert multiplies just the rows of the tokens that
chose it, so a quantized expert's blocks are read only when some token in the round chose it
(its weights are views into the file's map, one per expert).
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
        out = torch.zeros_like(x)
        # (token, slot) pairs sorted by expert: one product per expert that was chosen
        flat = chosen.flatten()
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.spec.experts).tolist()
        start = 0
        for expert, n in enumerate(counts):
            if not n:
                continue
            pairs = order[start:start + n]
            start += n
            tokens = pairs // self.spec.top_k
            y = self.experts[expert](x.index_select(0, tokens))
            out.index_add_(0, tokens, y * weights.flatten()[pairs, None])
        return out
