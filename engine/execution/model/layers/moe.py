"""The mixture-of-experts MLP (Qwen3-MoE): a router picks `top_k` experts per token (softmax
over all, the top weights renormalised where the config says so), each expert a gated MLP.

Tokens are batched by expert: each chosen expert multiplies just the rows of the tokens that
chose it, so a quantized expert's blocks are read only when some token in the round chose it
(its weights are views into the file's map, one per expert). A single row (one chat's decode
step) runs its top_k experts directly, with no sorting or gathering. Quantized experts over
float32 rows, decode rounds and prefill chunks alike, run all of it in one native call
(csrc/moe.c, each expert's product in the kernel quant.quant_matmul would pick), which the
fused decode layer calls too: no Python per expert. On a GPU the routing never comes back
to the host (that would wait for the device in every layer): the experts' weights are
stacked once and each round gathers or runs them all by device-side indices (`on_device`).
"""
from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import cast

import torch
from torch import nn

from engine.execution.model.config import MoESpec
from engine.execution.model.layers.activation import ACTIVATIONS
from engine.execution.model.layers.linear import Linear
from engine.execution.model.layers.mlp import GatedMLP
from engine.kernels import layer_ops, native, quant

# rows the native MoE takes in one call (its scratch grows with them); longer prefill chunks
# go through it in slices of this many
NATIVE_ROWS = 2048


def host_routing(x: torch.Tensor) -> bool:
    """Whether the routing may be read back to the host: free on the CPU with Ferry's
    kernels loaded; their absence is also how tests run, on a CPU, the path a GPU runs."""
    return x.device.type == "cpu" and native.library() is not None


def plain(w: object, shape: tuple[int, int]) -> bool:
    """w is a plain (not packed, not quantized) float matrix of `shape`."""
    return (isinstance(w, torch.Tensor) and w.layout == torch.strided and w.is_floating_point()
            and tuple(w.shape) == shape)


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
        self.hidden = hidden
        self.gate = Router(hidden, spec.experts, False, dtype, device)
        self.experts = nn.ModuleList(GatedMLP(hidden, spec.intermediate_size, act, False,
                                              dtype, device) for _ in range(spec.experts))
        self._native: ctypes.Structure | bool | None = False  # False: not looked at yet
        # every expert's gate_up and down weights stacked ([experts, 2 * inter, hidden],
        # [experts, hidden, inter]; the experts' weights become views of them), for the
        # routing that stays on the device; False: not looked at yet, None: not float
        self._stacked: tuple[torch.Tensor, torch.Tensor] | bool | None = False

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
            # reading the routing back costs nothing on the CPU with Ferry's kernels; on a
            # GPU (and on the CPU without the kernels, the path a GPU runs) it would wait
            # for the device in every layer: there the routing stays on the device
            stacked = None if host_routing(x) else self.stacked()
            return self.by_expert(x) if stacked is None else self.on_device(x, *stacked)
        if x.shape[0] <= NATIVE_ROWS:
            return layer_ops.moe_mlp(moe, x)
        return torch.cat([layer_ops.moe_mlp(moe, part) for part in torch.split(x, NATIVE_ROWS)])

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, hidden] -> (weights [T, top_k] in x's dtype, chosen experts [T, top_k])."""
        probs = torch.softmax(self.gate(x), dim=-1, dtype=torch.float32)  # [T, experts]
        weights, chosen = torch.topk(probs, self.spec.top_k, dim=-1)  # [T, top_k]
        if self.spec.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), chosen

    def stacked(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The experts' float weights stacked (built once; the experts then hold views of
        the stacks, so no memory is doubled), or None where they are not plain matrices."""
        if self._stacked is False:
            self._stacked = self._stack()
        return self._stacked if isinstance(self._stacked, tuple) else None

    def _stack(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        inter, hidden = self.spec.intermediate_size, self.hidden
        linears: list[tuple[Linear, Linear]] = []
        for e in self.experts:
            assert isinstance(e, GatedMLP)
            pair = (e.gate_up_proj, e.down_proj)
            if pair[0].bias is not None or pair[1].bias is not None:
                return None
            if not (plain(pair[0].weight, (2 * inter, hidden))
                    and plain(pair[1].weight, (hidden, inter))):
                return None
            linears.append(pair)
        with torch.no_grad():
            gate_up = torch.stack([cast(torch.Tensor, a.weight) for a, _ in linears])
            down = torch.stack([cast(torch.Tensor, b.weight) for _, b in linears])
        for i, (a, b) in enumerate(linears):  # views of the stacks: one copy in memory
            del a.weight, b.weight
            a.weight, b.weight = gate_up[i], down[i]
        return gate_up, down

    def on_device(self, x: torch.Tensor, gate_up: torch.Tensor,
                  down: torch.Tensor) -> torch.Tensor:
        """The layer with no host sync: few (token, expert) pairs (decode rounds) multiply
        each row by its own expert's gathered weights; more than there are experts (prefill
        chunks, wide decode rounds) run every expert over every row, weighted by a dense
        routing matrix that is zero where a token did not choose the expert."""
        weights, chosen = self.route(x)
        t, k, experts = x.shape[0], self.spec.top_k, self.spec.experts
        act = ACTIVATIONS[self.act]
        if t * k <= experts:
            flat = chosen.flatten()  # [T * k]
            rows = x.repeat_interleave(k, dim=0)  # [T * k, hidden], (token, slot) order
            h = torch.bmm(gate_up.index_select(0, flat), rows[:, :, None]).squeeze(2)
            y = torch.bmm(down.index_select(0, flat), act(h)[:, :, None]).squeeze(2)
            return (y.view(t, k, -1) * weights[:, :, None]).sum(dim=1)
        dense = torch.zeros(t, experts, dtype=x.dtype, device=x.device)
        dense.scatter_(1, chosen, weights)
        h = torch.matmul(x[None], gate_up.transpose(1, 2))  # [experts, T, 2 * inter]
        y = torch.bmm(act(h), down.transpose(1, 2))  # [experts, T, hidden]
        return torch.einsum("te,eth->th", dense, y)

    def by_expert(self, x: torch.Tensor) -> torch.Tensor:
        """The layer in torch, routed on the host (float experts on the CPU): x [T, hidden]."""
        weights, chosen = self.route(x)
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
