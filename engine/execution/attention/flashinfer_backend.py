"""FlashInfer attention (CUDA only): paged decode and prefill kernels over the same pools.

Imported lazily through the registry, so CPU installs never need flashinfer. The pool's
[num_pages, 2, kv_heads, page_size, d] layout is FlashInfer's "HND" paged layout, so the page
tables are passed as they are. What is planned each round (CSR arrays built on the host in
pinned int32 memory, one wrapper per pool and window, window_left) comes from
flashinfer_plan; this module only hands it to FlashInfer.

Every wrapper kind owns its float workspace: FlashInfer keeps a plan's scratch data there,
so two wrappers planned for the same round cannot share one. FlashInfer wants the workspace
zeroed before its first use.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from engine.execution.attention import flashinfer_plan as fp
from engine.execution.attention.base import AttentionBackend, AttentionInputs
from engine.execution.host import host_tensor
from engine.execution.kv_pool import KVPool

try:
    import flashinfer
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("the flashinfer backend needs `pip install 'ferry[gpu]'` "
                      "and a CUDA GPU") from exc

WORKSPACE_BYTES = 128 * 1024 * 1024  # FlashInfer's recommended float workspace


class FlashInferAttention(AttentionBackend):
    name = "flashinfer"

    def __init__(self, pool: KVPool, num_heads: int, num_kv_heads: int, head_dim: int,
                 scale: float, windows: Sequence[int | None] = (),
                 local_pool: KVPool | None = None) -> None:
        super().__init__(pool, num_heads, num_kv_heads, head_dim, scale, windows, local_pool)
        for p in (pool,) if local_pool is None else (pool, local_pool):
            reason = fp.unsupported(p.device.type, head_dim, p.dtype)
            if reason:
                raise ValueError(f"the flashinfer backend cannot run this model: {reason}")
        layers = max(len(self.windows), pool.num_layers + (local_pool.num_layers
                                                            if local_pool else 0))
        self.kinds, self.kind_of = fp.layer_kinds(
            [(self.place(i)[2], self.window(i)) for i in range(layers)])
        tensor_cores = fp.use_tensor_cores(num_heads, num_kv_heads)
        # per kind: (decode wrapper, prefill wrapper), on their own zeroed workspace
        self._wrappers: list[tuple[Any, Any]] = []  # flashinfer ships no types
        for _ in self.kinds:
            workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=pool.device)
            self._wrappers.append((
                flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                    workspace, "HND", use_tensor_cores=tensor_cores),
                flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "HND")))
        self._active: list[Any] = []  # per kind, the wrapper planned for this round
        self._where: tuple[tuple[torch.Tensor, torch.Tensor], ...] = ()
        self._pin = pool.device.type == "cuda"  # pinned host memory needs a CUDA build

    def _i32(self, values: list[int]) -> torch.Tensor:
        return host_tensor(values, torch.int32, self._pin)

    def prepare(self, inputs: AttentionInputs) -> None:
        if any(rows > 1 for _, _, rows in inputs.spans):
            # the causal kernels planned here would drop the image's own later positions;
            # a model with such images runs the torch backend (choice.choose)
            raise ValueError("the flashinfer backend attends causally only: an image "
                             "attended as a whole needs the torch backend")
        wrapper = fp.wrapper_for(inputs.query_lens)
        qo = self._i32(fp.qo_indptr(inputs.query_lens)) if wrapper == "prefill" else None
        csrs: dict[bool, tuple[torch.Tensor, ...]] = {}
        where = []
        for local, pool in ((False, self.pool), (True, self.local_pool)):
            if pool is None:
                continue
            kv_lens, tables, slots = inputs.part(local)
            csr = fp.page_csr(tables, kv_lens, pool.page_size)
            csrs[local] = (self._i32(csr.indptr), self._i32(csr.indices),
                           self._i32(csr.last_page_len))
            where.append(pool.locate(slots))
        self._where = tuple(where)
        self._active = []
        for kind, (decode, prefill) in zip(self.kinds, self._wrappers):
            pool = self.local_pool if kind.local and self.local_pool else self.pool
            indptr, indices, last = csrs[kind.local and self.local_pool is not None]
            common = {"pos_encoding_mode": "NONE", "window_left": kind.window_left,
                      "sm_scale": self.scale, "q_data_type": pool.dtype,
                      "kv_data_type": pool.dtype, "non_blocking": True}
            if wrapper == "decode":
                decode.plan(indptr, indices, last, self.num_heads, self.num_kv_heads,
                            self.head_dim, pool.page_size, **common)
                self._active.append(decode)
            else:
                prefill.plan(qo, indptr, indices, last, self.num_heads, self.num_kv_heads,
                             self.head_dim, pool.page_size, causal=True, **common)
                self._active.append(prefill)

    def forward(self, q: torch.Tensor, kv: torch.Tensor, layer: int) -> torch.Tensor:
        pool, index, local = self.place(layer)
        pool.write(index, self._where[1 if local else 0], kv)
        # the kernels take q in the K/V's type (planned so): a bfloat16 model over a float16
        # cache rounds its queries to float16, and its output comes back in its own type
        qk = q.to(pool.dtype).contiguous()
        out: torch.Tensor = self._active[self.kind_of[layer]].run(qk, pool.paged(index))
        return out.to(q.dtype).reshape(q.shape[0], self.num_heads * self.head_dim)
