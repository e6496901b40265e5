"""Which attention backend a model runs with, and why (shown in the banner and `doctor`).

FlashInfer is taken only on CUDA, where it can run the model's K/V (flashinfer_plan), and
after a start-up self-test: one small decode round and one prefill round, planned and run by
FlashInfer and by the torch backend over the same pool, must agree. An install without
kernels (no prebuilt kernels and no compiler), a driver it cannot use, or a wrong result
fails that test once, at load, instead of every round: the torch backend runs instead and
the reason is kept. The result is cached per shape for the process.
"""
from __future__ import annotations

import importlib
import importlib.util
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.execution.attention import flashinfer_plan as fp
from engine.execution.attention.base import AttentionInputs
from engine.execution.kv_pool import KVPool

log = logging.getLogger(__name__)

SELF_TEST_TOLERANCE = 3e-2  # half-precision kernels against the torch reference
_tested: dict[tuple[object, ...], str | None] = {}  # shape -> None (passed) or the failure


@dataclass(frozen=True, slots=True)
class BackendChoice:
    name: str  # "torch" / "flashinfer"
    reason: str  # why, in words


def flashinfer_missing() -> str | None:
    """Why FlashInfer cannot be imported, or None."""
    if importlib.util.find_spec("flashinfer") is None:
        return "FlashInfer is not installed (pip install 'ferry[gpu]')"
    try:
        importlib.import_module("flashinfer")
    except Exception as exc:  # a broken install: any import error
        return f"FlashInfer does not import: {exc}"
    return None


def flashinfer_version() -> str:
    try:
        return str(importlib.import_module("flashinfer").__version__)
    except Exception:  # not there, or broken: the reason is reported elsewhere
        return "?"


def choose(device: torch.device, kv_dtype: torch.dtype, num_heads: int, num_kv_heads: int,
           head_dim: int, scale: float, page_size: int,
           windows: Sequence[int | None] = (), whole_images: bool = False) -> BackendChoice:
    """FlashInfer where it can run this model and passes its self-test, else torch.
    `whole_images`: the model's image positions attend to one another both ways (Gemma 3),
    which Ferry's FlashInfer plans (causal) do not do."""
    if device.type not in fp.DEVICES:
        return BackendChoice("torch", "the CPU runs the torch backend" if device.type == "cpu"
                             else f"FlashInfer runs on CUDA only, not {device.type}")
    reason = ("an image's positions attend to one another both ways, which the FlashInfer "
              "plans do not do" if whole_images else None) \
        or fp.unsupported(device.type, head_dim, kv_dtype) or flashinfer_missing()
    how = "kernels from the stand-in"
    if reason is None and device.type == "cuda":
        from engine.execution.devices import flashinfer_kernels

        ok, how = flashinfer_kernels()
        reason = None if ok else f"FlashInfer has no kernels: {how}"
    if reason is None:
        widest = max((w for w in windows if w), default=None)
        key = (str(device), kv_dtype, num_heads, num_kv_heads, head_dim, page_size, widest)
        if key not in _tested:
            _tested[key] = self_test(device, kv_dtype, num_heads, num_kv_heads, head_dim,
                                     scale, page_size, widest)
        reason = _tested[key]
    if reason is None:
        return BackendChoice("flashinfer", f"FlashInfer {flashinfer_version()}, kernels "
                                           f"{how}, self-test passed")
    log.warning("attention: the torch backend runs: %s", reason)
    return BackendChoice("torch", reason)


def self_test(device: torch.device, kv_dtype: torch.dtype, num_heads: int, num_kv_heads: int,
              head_dim: int, scale: float, page_size: int, window: int | None) -> str | None:
    """Run one decode and one prefill round through both backends -> None when FlashInfer
    agrees with the torch backend, else what went wrong."""
    from engine.execution.attention.torch_backend import TorchAttention

    try:
        from engine.execution.attention.flashinfer_backend import FlashInferAttention

        windows = (None, window) if window else (None,)
        pools = [KVPool(len(windows), 16, page_size, num_kv_heads, head_dim, kv_dtype, device)
                 for _ in range(2)]
        fi = FlashInferAttention(pools[0], num_heads, num_kv_heads, head_dim, scale, windows)
        ref = TorchAttention(pools[1], num_heads, num_kv_heads, head_dim, scale, windows)
        gen = torch.Generator(device="cpu").manual_seed(0)
        pages_each = 16 // 2
        tables = [list(range(0, pages_each)), list(range(pages_each, 16))]
        # a prefill round (one short prompt, one longer), then a decode round after it
        rounds = [[3, min(2 * page_size + 5, pages_each * page_size - 1)], [1, 1]]
        kv_lens = [0, 0]
        for query_lens in rounds:
            starts = list(kv_lens)
            kv_lens = [s + q for s, q in zip(starts, query_lens)]
            slots = [t[p // page_size] * page_size + p % page_size
                     for t, s, q in zip(tables, starts, query_lens) for p in range(s, s + q)]
            inputs = AttentionInputs(query_lens, kv_lens, tables,
                                     torch.tensor(slots, dtype=torch.int64, device=device))
            n = sum(query_lens)
            q = torch.randn(n, num_heads, head_dim, generator=gen, device="cpu")
            kv = torch.randn(n, 2, num_kv_heads, head_dim, generator=gen, device="cpu")
            q, kv = q.to(device, kv_dtype), kv.to(device, kv_dtype)
            for backend in (fi, ref):
                backend.prepare(inputs)
            for layer in range(len(windows)):
                got = fi.forward(q, kv, layer).float()
                want = ref.forward(q, kv, layer).float()
                err = float((got - want).abs().max())
                if not err <= SELF_TEST_TOLERANCE:
                    return (f"FlashInfer's self-test differs from the torch backend by {err:.3g} "
                            f"(layer window {windows[layer]}, queries {query_lens})")
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as exc:  # no kernels, no compiler, an old driver: reported, not raised
        return f"FlashInfer failed its self-test: {type(exc).__name__}: {exc}"
    return None
