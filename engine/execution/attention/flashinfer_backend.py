"""FlashInfer attention (CUDA only): paged decode and prefill kernels over the same pool.

Imported lazily through the registry, so CPU installs never need flashinfer. The pool's
[num_pages, 2, kv_heads, page_size, d] layout is FlashInfer's "HND" paged layout, so the page
tables are passed as they are (CSR: indptr, indices, last_page_len). A round of only
single-token sequences uses the decode wrapper; any other round uses the prefill wrapper for
all its sequences (it handles one-token queries too, and aligns the causal mask to each
sequence's end, which is what a chunk after a cached prefix needs).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from engine.execution.attention.base import AttentionBackend, AttentionInputs
from engine.execution.kv_pool import KVPool

try:
    import flashinfer
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("the flashinfer backend needs `pip install flashinfer-python` "
                      "and a CUDA GPU") from exc

WORKSPACE_BYTES = 128 * 1024 * 1024


class FlashInferAttention(AttentionBackend):
    name = "flashinfer"

    def __init__(self, pool: KVPool, num_heads: int, num_kv_heads: int, head_dim: int,
                 scale: float, windows: Sequence[int | None] = (),
                 local_pool: KVPool | None = None) -> None:
        super().__init__(pool, num_heads, num_kv_heads, head_dim, scale, windows, local_pool)
        if any(self.windows) or local_pool is not None:
            raise ValueError("the flashinfer backend does not run sliding-window layers yet; "
                             "use the torch backend")
        if pool.device.type != "cuda":
            raise ValueError("the flashinfer backend needs the KV pool on a CUDA device")
        if pool.dtype not in (torch.float16, torch.bfloat16):
            raise ValueError("the flashinfer backend needs a float16 or bfloat16 model")
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=pool.device)
        self._decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            workspace, "HND", use_tensor_cores=num_heads // num_kv_heads > 4)
        self._prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "HND")
        # a flashinfer wrapper once prepared (flashinfer ships no types: Any)
        self._wrapper: Any = None

    def prepare(self, inputs: AttentionInputs) -> None:
        ps = self.pool.page_size
        used = [-(-kv // ps) for kv in inputs.kv_lens]
        indices = [p for pages, u in zip(inputs.page_tables, used) for p in pages[:u]]
        indptr = [0]
        for u in used:
            indptr.append(indptr[-1] + u)
        last = [kv - (u - 1) * ps for kv, u in zip(inputs.kv_lens, used)]
        device = self.pool.device

        def i32(xs: list[int]) -> torch.Tensor:
            return torch.tensor(xs, dtype=torch.int32, device=device)

        kv_indptr = i32(indptr)
        kv_indices = i32(indices)
        kv_last = i32(last)
        dtype = self.pool.dtype
        self.where = self.pool.locate(inputs.slot_mapping)
        if all(q == 1 for q in inputs.query_lens):
            self._decode.plan(kv_indptr, kv_indices, kv_last, self.num_heads, self.num_kv_heads,
                              self.head_dim, ps, pos_encoding_mode="NONE", sm_scale=self.scale,
                              q_data_type=dtype, kv_data_type=dtype)
            self._wrapper = self._decode
        else:
            qo = [0]
            for q in inputs.query_lens:
                qo.append(qo[-1] + q)
            self._prefill.plan(i32(qo), kv_indptr, kv_indices, kv_last,
                               self.num_heads, self.num_kv_heads, self.head_dim, ps,
                               causal=True, pos_encoding_mode="NONE", sm_scale=self.scale,
                               q_data_type=dtype, kv_data_type=dtype)
            self._wrapper = self._prefill

    def forward(self, q: torch.Tensor, kv: torch.Tensor, layer: int) -> torch.Tensor:
        self.pool.write(layer, self.where, kv)
        out: torch.Tensor = self._wrapper.run(q.contiguous(), self.pool.paged(layer))
        return out.reshape(q.shape[0], self.num_heads * self.head_dim)
