"""A stand-in for FlashInfer's paged attention wrappers, for tests only (no GPU here).

It checks every argument the way FlashInfer (0.6.x) does, or stricter, and raises where
FlashInfer would: workspace type, size and zeroing; layouts; int32 one-dimensional index
arrays that agree with each other; head sizes its prefill kernels are built for (64, 128,
256); query/KV dtypes against those planned; plan before run; tensors on the workspace's
device. It then computes the attention in float32 torch: causal, aligned to each sequence's
end, limited to `window_left` + 1 positions when set. Tests put its folder first on sys.path
(tests/fakes/stand_ins.py), so `import flashinfer` finds it.
"""
from __future__ import annotations

import itertools
from typing import Any

import torch

__version__ = "0.6.13+fake"
FAKE = True

HEAD_DIMS = (64, 128, 256)
Q_DTYPES = (torch.float16, torch.bfloat16)
KV_DTYPES = (torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2)
POS_ENCODINGS = ("NONE", "ROPE_LLAMA", "ALIBI")
MIN_WORKSPACE = 16 * 1024 * 1024

calls: list[tuple[str, str]] = []  # (wrapper, "plan" / "run"), for tests that count them


def _dtype(value: str | torch.dtype | None, default: torch.dtype | None) -> torch.dtype:
    if value is None:
        if default is None:
            raise ValueError("no data type given")
        return default
    if isinstance(value, str):
        value = getattr(torch, value)
    assert isinstance(value, torch.dtype)
    return value


def _index(name: str, t: Any, length: int | None = None) -> list[int]:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise ValueError(f"{name} must be int32, got {t.dtype}")
    if t.dim() != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {tuple(t.shape)}")
    if length is not None and t.shape[0] != length:
        raise ValueError(f"{name} has {t.shape[0]} entries, expected {length}")
    values: list[int] = t.tolist()
    return values


def _indptr(name: str, t: Any) -> list[int]:
    values = _index(name, t)
    if not values or values[0] != 0 or any(b < a for a, b in itertools.pairwise(values)):
        raise ValueError(f"{name} must start at 0 and never decrease: {values}")
    return values


class _Wrapper:
    kind = ""

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD",
                 **options: Any) -> None:
        ws = float_workspace_buffer
        if not isinstance(ws, torch.Tensor) or ws.dtype != torch.uint8 or ws.dim() != 1:
            raise ValueError("the float workspace must be a one-dimensional uint8 tensor")
        if ws.numel() < MIN_WORKSPACE:
            raise ValueError(f"a {ws.numel()}-byte workspace is too small for split-k")
        if bool(ws.any()):
            raise ValueError("the float workspace must be zero-initialized for its first use")
        if kv_layout not in ("NHD", "HND"):
            raise KeyError(f"Invalid kv_layout {kv_layout}")
        self.device = ws.device
        self.layout = kv_layout
        self.options = options
        self._plan: dict[str, Any] | None = None

    def _plan_common(self, indptr: torch.Tensor, indices: torch.Tensor,
                     last_page_len: torch.Tensor, num_qo_heads: int, num_kv_heads: int,
                     head_dim: int, page_size: int, pos_encoding_mode: str,
                     window_left: int, sm_scale: float | None,
                     q_data_type: str | torch.dtype | None,
                     kv_data_type: str | torch.dtype | None) -> dict[str, Any]:
        ptr = _indptr("paged_kv_indptr", indptr)
        pages = _index("paged_kv_indices", indices, ptr[-1])
        last = _index("paged_kv_last_page_len", last_page_len, len(ptr) - 1)
        if any(not 1 <= n <= page_size for n in last):
            raise ValueError(f"last_page_len must lie in [1, {page_size}]: {last}")
        if any(b == a for a, b in itertools.pairwise(ptr)):
            raise ValueError("every sequence needs at least one page")
        if num_qo_heads % num_kv_heads:
            raise ValueError("num_qo_heads must be a multiple of num_kv_heads")
        if head_dim not in HEAD_DIMS:
            raise ValueError(f"head_dim {head_dim} is not compiled (supported: {HEAD_DIMS})")
        if pos_encoding_mode not in POS_ENCODINGS:
            raise KeyError(f"Invalid pos_encoding_mode {pos_encoding_mode}")
        if not isinstance(window_left, int) or window_left < -1:
            raise ValueError(f"window_left must be -1 or >= 0, got {window_left}")
        q_dtype = _dtype(q_data_type, torch.float16)
        kv_dtype = _dtype(kv_data_type, q_dtype)
        if q_dtype not in Q_DTYPES or kv_dtype not in KV_DTYPES:
            raise ValueError(f"unsupported q/kv data types {q_dtype}/{kv_dtype}")
        if kv_dtype in Q_DTYPES and kv_dtype != q_dtype:
            raise ValueError(f"q {q_dtype} and kv {kv_dtype}: no kernel for the pair")
        kv_lens = [(b - a - 1) * page_size + n for a, b, n in zip(ptr, ptr[1:], last)]
        return {"ptr": ptr, "pages": pages, "kv_lens": kv_lens, "heads": num_qo_heads,
                "kv_heads": num_kv_heads, "head_dim": head_dim, "page_size": page_size,
                "window_left": window_left, "scale": sm_scale or head_dim ** -0.5,
                "q_dtype": q_dtype, "kv_dtype": kv_dtype}

    def _run(self, q: torch.Tensor, paged_kv_cache: Any, qo: list[int]) -> torch.Tensor:
        if self._plan is None:
            raise RuntimeError("plan() must be called before run()")
        p = self._plan
        calls.append((self.kind, "run"))
        if isinstance(paged_kv_cache, tuple):
            raise NotImplementedError("Ferry passes the single-tensor paged cache")
        cache = paged_kv_cache
        if q.device != self.device or cache.device != self.device:
            raise ValueError(f"q on {q.device}, cache on {cache.device}, workspace on "
                             f"{self.device}: all must be on one device")
        if q.dtype != p["q_dtype"]:
            raise ValueError(f"The dtype of q {q.dtype} does not match the q_data_type "
                             f"{p['q_dtype']} specified in plan function.")
        if cache.dtype != p["kv_dtype"]:
            raise ValueError(f"The dtype of k {cache.dtype} does not match the kv_data_type "
                             f"{p['kv_dtype']} specified in plan function.")
        if not q.is_contiguous():
            raise ValueError("q must be contiguous")
        if tuple(q.shape) != (qo[-1], p["heads"], p["head_dim"]):
            raise ValueError(f"q has shape {tuple(q.shape)}, the plan "
                             f"{(qo[-1], p['heads'], p['head_dim'])}")
        kvh, ps, d = p["kv_heads"], p["page_size"], p["head_dim"]
        if cache.dim() != 5 or cache.shape[1] != 2:
            raise ValueError(f"a single-tensor paged cache is 5-D with K and V in dim 1, got "
                             f"{tuple(cache.shape)}")
        want = (2, kvh, ps, d) if self.layout == "HND" else (2, ps, kvh, d)
        if tuple(cache.shape[1:]) != want:
            raise ValueError(f"cache pages have shape {tuple(cache.shape[1:])}, the plan "
                             f"and layout {self.layout} {want}")
        if any(not 0 <= page < cache.shape[0] for page in p["pages"]):
            raise IndexError("a page index lies outside the cache")
        out = torch.empty_like(q)
        group = p["heads"] // kvh
        for r, kv in enumerate(p["kv_lens"]):
            pages = p["pages"][p["ptr"][r]:p["ptr"][r + 1]]
            blocks = cache[torch.tensor(pages, device=cache.device)].float()
            if self.layout == "NHD":
                blocks = blocks.transpose(2, 3)  # -> [pages, 2, kv_heads, page_size, d]
            k, v = (blocks[:, c].permute(1, 0, 2, 3).reshape(kvh, -1, d)[:, :kv]
                    for c in (0, 1))
            qr = q[qo[r]:qo[r + 1]].float()  # [n, heads, d]
            n = qr.shape[0]
            qpos = torch.arange(kv - n, kv, device=q.device)[:, None]
            kpos = torch.arange(kv, device=q.device)[None, :]
            allowed = kpos <= qpos
            if p["window_left"] >= 0:
                allowed &= kpos >= qpos - p["window_left"]
            k = k.repeat_interleave(group, dim=0)
            v = v.repeat_interleave(group, dim=0)
            scores = torch.einsum("nhd,hkd->hnk", qr, k) * p["scale"]
            scores = scores.masked_fill(~allowed[None], float("-inf"))
            probs = torch.softmax(scores, dim=-1)
            out[qo[r]:qo[r + 1]] = torch.einsum("hnk,hkd->nhd", probs, v).to(q.dtype)
        return out


class BatchDecodeWithPagedKVCacheWrapper(_Wrapper):
    kind = "decode"

    def plan(self, indptr: torch.Tensor, indices: torch.Tensor, last_page_len: torch.Tensor,
             num_qo_heads: int, num_kv_heads: int, head_dim: int, page_size: int,
             pos_encoding_mode: str = "NONE", window_left: int = -1,
             logits_soft_cap: float | None = None,
             q_data_type: str | torch.dtype | None = "float16",
             kv_data_type: str | torch.dtype | None = None, sm_scale: float | None = None,
             non_blocking: bool = True, **unused: Any) -> None:
        if unused:
            raise TypeError(f"unexpected plan arguments {sorted(unused)}")
        self._plan = self._plan_common(indptr, indices, last_page_len, num_qo_heads,
                                       num_kv_heads, head_dim, page_size, pos_encoding_mode,
                                       window_left, sm_scale, q_data_type, kv_data_type)
        calls.append((self.kind, "plan"))

    def run(self, q: torch.Tensor, paged_kv_cache: Any, **unused: Any) -> torch.Tensor:
        if self._plan is None:
            raise RuntimeError("plan() must be called before run()")
        return self._run(q, paged_kv_cache, list(range(len(self._plan["kv_lens"]) + 1)))


class BatchPrefillWithPagedKVCacheWrapper(_Wrapper):
    kind = "prefill"

    def plan(self, qo_indptr: torch.Tensor, paged_kv_indptr: torch.Tensor,
             paged_kv_indices: torch.Tensor, paged_kv_last_page_len: torch.Tensor,
             num_qo_heads: int, num_kv_heads: int, head_dim_qk: int, page_size: int,
             head_dim_vo: int | None = None, custom_mask: torch.Tensor | None = None,
             causal: bool = False, pos_encoding_mode: str = "NONE",
             sm_scale: float | None = None, window_left: int = -1,
             q_data_type: str | torch.dtype = "float16",
             kv_data_type: str | torch.dtype | None = None,
             non_blocking: bool = True, **unused: Any) -> None:
        if unused:
            raise TypeError(f"unexpected plan arguments {sorted(unused)}")
        if custom_mask is not None or not causal:
            raise NotImplementedError("the stand-in computes causal attention only")
        if head_dim_vo not in (None, head_dim_qk):
            raise NotImplementedError("the stand-in needs head_dim_vo == head_dim_qk")
        plan = self._plan_common(paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
                                 num_qo_heads, num_kv_heads, head_dim_qk, page_size,
                                 pos_encoding_mode, window_left, sm_scale, q_data_type,
                                 kv_data_type)
        qo = _indptr("qo_indptr", qo_indptr)
        if len(qo) != len(plan["ptr"]):
            raise ValueError("qo_indptr and paged_kv_indptr describe different batches")
        if any(b - a > kv for a, b, kv in zip(qo, qo[1:], plan["kv_lens"])):
            raise ValueError("a sequence has more queries than KV positions")
        plan["qo"] = qo
        self._plan = plan
        calls.append((self.kind, "plan"))

    def run(self, q: torch.Tensor, paged_kv_cache: Any, **unused: Any) -> torch.Tensor:
        if self._plan is None:
            raise RuntimeError("plan() must be called before run()")
        return self._run(q, paged_kv_cache, self._plan["qo"])
