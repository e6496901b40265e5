"""The mixture-of-experts MLP (Qwen3-MoE): a router picks `top_k` experts per token (softmax
over all, the top weights renormalised where the config says so), each expert a gated MLP.

Tokens are batched by expert: each chosen expert multiplies just the rows of the tokens that
chose it, so a quantized expert's blocks are read only when some token in the round chose it
(its weights are views into the file's map, one per expert). A single row (one chat's decode
step) runs its top_k experts directly, with no sorting or gathering. Quantized experts over
float32 rows, decode rounds and prefill chunks alike, run all of it in one native call
(csrc/moe.c, each expert's product in the kernel quant.quant_matmul would pick), which the
fused decode layer calls too: no Python per expert.
"""
from __future__ import annotations

import ctypes
from collections.abc import Sequence

import torch
from torch import nn

from engine.execution.model.config import MoESpec
from engine.execution.model.layers.linear import Linear
from engine.execution.model.layers.mlp import GatedMLP
from engine.kernels import layer_ops, native, quant

# rows the native MoE takes in one call (its scratch grows with them); longer prefill chunks
# go through it in slices of this many
NATIVE_ROWS = 2048


class Router(Linear):
    """The router's projection. A float32 weight stays a plain matrix (not oneDNN-packed): the
    native MoE reads it as one."""

    def pack(self, wide: bool = False) -> None:
        if not (isinstance(self.weight, torch.Tensor) and self.weight.dtype == torch.float32):
            super().pack(wide)


class MoEMLP(nn.Module):
    def __init__(self, hidden: int, spec: MoESpec, act: str, dtype: torch.dtype,
                 device: torch.device | str | None) -> None:
        super().__init__()
        self.spec = spec
        self.act = act
        self.gate = Router(hidden, spec.experts, False, dtype, device)
        self.experts = nn.ModuleList(GatedMLP(hidden, spec.intermediate_size, act, False,
                                              dtype, device) for _ in range(spec.experts))
        self._native: ctypes.Structure | bool | None = False  # False: not looked at yet

    def native(self) -> ctypes.Structure | None:
        """The layer as csrc/moe.c runs it (layer_ops.MoE), or None where it cannot: float
        experts, an activation it lacks. Built once the weights are loaded."""
        if self._native is False:
            self._native = self._build_native()
        return self._native if isinstance(self._native, ctypes.Structure) else None

    def _build_native(self) -> ctypes.Structure | None:
        if self.act not in layer_ops.ACTS or native.library() is None:
            return None
        w = self.gate.weight
        if isinstance(w, torch.Tensor):  # a plain float32 matrix (Router.pack keeps it so)
            if w.dtype != torch.float32 or w.dim() != 2 or w.device.type != "cpu":
                return None
            router: Sequence[quant.QuantWeight] | None = (quant.QuantWeight(
                quant.F32, w.contiguous().view(torch.uint8), w.shape[1], w.shape[0]),)
        else:
            router = self.gate.block_parts(layer_ops.MAX_PARTS)
        if router is None:
            return None
        experts = []
        for e in self.experts:
            assert isinstance(e, GatedMLP)
            gate_up = e.gate_up_proj.block_parts(layer_ops.MAX_PARTS)
            down = e.down_proj.block_parts(layer_ops.MAX_PARTS)
            if gate_up is None or down is None:
                return None
            experts.append((gate_up, down))
        return layer_ops.moe(router, experts, self.spec.top_k, self.spec.normalize, self.act,
                             self.spec.intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]."""
        moe = self.native() if x.dtype == torch.float32 and x.device.type == "cpu" else None
        if moe is None:
            return self.by_expert(x)
        if x.shape[0] <= NATIVE_ROWS:
            return layer_ops.moe_mlp(moe, x)
        return torch.cat([layer_ops.moe_mlp(moe, part) for part in torch.split(x, NATIVE_ROWS)])

    def by_expert(self, x: torch.Tensor) -> torch.Tensor:
        """The layer in torch (float experts, CUDA, no native library): x [T, hidden]."""
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
