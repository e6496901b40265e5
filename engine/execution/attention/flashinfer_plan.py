"""What FlashInfer is asked to do each round, worked out without FlashInfer or a GPU.

Pure functions over Python lists, so they are unit-tested anywhere:

* whether FlashInfer can run a model at all (`unsupported`: its kernels take float16 or
  bfloat16 K/V, and its prefill kernels head sizes 64, 128 and 256 only);
* which wrappers a model needs: one per (pool, window) kind of layer (`layer_kinds`), since a
  plan carries one `window_left`; a window of w positions (its own included) is
  `window_left = w - 1`, no window is -1;
* one round's CSR page tables (`page_csr`) and query offsets (`qo_indptr`), in int32 on the
  host: FlashInfer's `plan` reads indptr on the host and copies the indices over itself, so
  device copies would only be copied back;
* which wrapper a round uses (`wrapper_for`): the decode wrapper when every sequence has one
  query token, else the prefill wrapper for all of them (it aligns the causal mask to each
  sequence's end, which a chunk after a cached prefix needs).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

PREFILL_HEAD_DIMS = (64, 128, 256)  # the head sizes FlashInfer's prefill kernels are built for
KV_DTYPES = (torch.float16, torch.bfloat16)
DEVICES = ("cuda",)  # tests add "cpu" to run the adapter over a stand-in flashinfer
Wrapper = Literal["decode", "prefill"]


@dataclass(frozen=True, slots=True)
class PageCsr:
    """Page tables as FlashInfer takes them: sequence r's pages are
    indices[indptr[r]:indptr[r + 1]], the last holding last_page_len[r] positions."""

    indptr: list[int]
    indices: list[int]
    last_page_len: list[int]


@dataclass(frozen=True, slots=True)
class LayerKind:
    """The layers planned together: those in the same pool with the same window."""

    local: bool  # in the local (sliding-window) layers' pool
    window_left: int  # -1: attends to the whole prefix


def unsupported(device_type: str, head_dim: int, kv_dtype: torch.dtype) -> str | None:
    """Why FlashInfer cannot run a model with these K/V, or None when it can."""
    if device_type not in DEVICES:
        return "FlashInfer runs on CUDA only"
    if kv_dtype not in KV_DTYPES:
        return (f"FlashInfer's kernels take float16 or bfloat16 K/V, the KV pool is "
                f"{str(kv_dtype).removeprefix('torch.')}")
    if head_dim not in PREFILL_HEAD_DIMS:
        return (f"FlashInfer's prefill kernels take head sizes "
                f"{', '.join(map(str, PREFILL_HEAD_DIMS))}, the model's is {head_dim}")
    return None


def window_left(window: int | None) -> int:
    """A window of `window` positions (the query's own included) as FlashInfer's
    `window_left`: the query at position i sees [i - window_left, i]; -1: no window."""
    if window is None:
        return -1
    if window < 1:
        raise ValueError(f"a sliding window must hold at least one position, got {window}")
    return window - 1


def layer_kinds(placement: Sequence[tuple[bool, int | None]]
                ) -> tuple[list[LayerKind], list[int]]:
    """Per layer (in the local pool?, its window) -> (the distinct kinds in first-seen order,
    each layer's index into them). Each kind gets its own planned wrapper."""
    kinds: list[LayerKind] = []
    of_layer: list[int] = []
    for local, window in placement:
        kind = LayerKind(local, window_left(window))
        if kind not in kinds:
            kinds.append(kind)
        of_layer.append(kinds.index(kind))
    return kinds, of_layer


def page_csr(page_tables: Sequence[Sequence[int]], kv_lens: Sequence[int],
             page_size: int) -> PageCsr:
    """Each sequence's pages up to its KV length, as CSR arrays."""
    if len(page_tables) != len(kv_lens):
        raise ValueError("page_tables and kv_lens differ in length")
    indptr, indices, last = [0], list[int](), list[int]()
    for pages, kv in zip(page_tables, kv_lens):
        used = -(-kv // page_size)
        if kv < 1 or used > len(pages):
            raise ValueError(f"a KV length of {kv} needs {used} pages, the table has "
                             f"{len(pages)}")
        indices.extend(pages[:used])
        indptr.append(indptr[-1] + used)
        last.append(kv - (used - 1) * page_size)
    return PageCsr(indptr, indices, last)


def qo_indptr(query_lens: Sequence[int]) -> list[int]:
    """Offsets of each sequence's query rows in the packed round."""
    out = [0]
    for q in query_lens:
        out.append(out[-1] + q)
    return out


def wrapper_for(query_lens: Sequence[int]) -> Wrapper:
    return "decode" if all(q == 1 for q in query_lens) else "prefill"


def use_tensor_cores(num_heads: int, num_kv_heads: int) -> bool:
    """Decode with the prefill (tensor-core) kernels for wide query groups, as FlashInfer
    recommends for GQA groups above 4."""
    return num_heads // num_kv_heads > 4
