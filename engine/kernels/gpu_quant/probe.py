"""Before a model's blocks go to a GPU: run one small product of each block type it holds on
that device and check it against gguf-py's dequantisation, so a Triton that cannot compile
for the card, or computes wrongly there, costs a dequantised load instead of every round."""
from __future__ import annotations

import functools
import logging

import numpy as np
import torch

from engine.kernels.gpu_quant import layouts
from engine.kernels.gpu_quant.weight import DeviceBlocks, DeviceQuantWeight

log = logging.getLogger(__name__)

ROWS = (1, 16)  # the broadcast product (decode) and tl.dot (prefill)
OUT, BLOCKS = 32, 2  # a weight of 32 rows of two blocks


def _blocks(qtype: int, rng: np.random.Generator) -> np.ndarray:
    """Random valid blocks: any bytes, with finite f16 scales in their places."""
    _, _, nbytes = layouts.LAYOUTS[qtype]
    data = rng.integers(0, 256, size=(OUT, BLOCKS, nbytes), dtype=np.uint8)
    scales = [208] if qtype == layouts.Q6_K else \
        [0, 2] if qtype in (layouts.Q4_1, layouts.Q4_K, layouts.Q5_K) else [0]
    for at in scales:
        f16 = rng.uniform(0.01, 0.1, size=(OUT, BLOCKS)).astype(np.float16)
        data[:, :, at:at + 2] = f16.view(np.uint8).reshape(OUT, BLOCKS, 2)
    return data.reshape(OUT, -1)


def _check(qtype: int, device: torch.device, dtype: torch.dtype) -> None:
    import gguf

    from engine.kernels.gpu_quant import launch

    blocks = _blocks(qtype, np.random.default_rng(qtype))
    _, qk, _ = layouts.LAYOUTS[qtype]
    ref = torch.from_numpy(gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType(qtype)))
    weight = DeviceQuantWeight((DeviceBlocks(qtype, torch.from_numpy(blocks).to(device),
                                             qk * BLOCKS, OUT),))
    gen = torch.Generator(device="cpu").manual_seed(0)
    for rows in ROWS:
        x = torch.randn(rows, qk * BLOCKS, generator=gen, device="cpu").to(dtype)
        got = launch.matmul(x.to(device), weight).float().cpu()
        want = x.float() @ ref.T
        err = float((got - want).abs().max())
        # bf16 / fp16 activations: the products round to 8 / 11 bits before the f32 sums
        if not err <= 0.02 * float(want.abs().max()) + 1e-3:
            raise ArithmeticError(f"{layouts.name(qtype)} product off by {err:.3g}")


@functools.cache
def failure(device: torch.device, dtype: torch.dtype, qtypes: frozenset[int]) -> str | None:
    """Why products of these block types do not work on `device` with `dtype` activations
    (None: they do). Run once per combination."""
    for qtype in sorted(qtypes):
        try:
            _check(qtype, device, dtype)
        except Exception as exc:  # a compile error, a launch failure, a wrong result
            log.warning("the %s block kernel fails its self-test on %s: %s",
                        layouts.name(qtype), device, exc)
            return f"the {layouts.name(qtype)} block kernel failed its self-test ({exc})"
    return None
