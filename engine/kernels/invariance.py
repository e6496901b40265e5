"""Batch invariance: each row of a round computed as it would be alone (settings'
`deterministic`), so that a request at temperature 0 gets the same reply whatever else shares
its rounds, however its prompt is chunked and whatever part of it the prefix cache held.

With a quantized model's int8 activations, a last-digit difference anywhere can move a value
across a rounding edge, and a reply then takes another token where two are close. Two choices
by row count give such differences (docs/kernels.md, Reproducibility): AMX tiles against lanes
for a product, torch's SDPA against Ferry's decode kernel for a long prefill chunk's
attention. Invariance keeps both on the per-row side: lanes (or the dot products) for every
product of a model in blocks, the decode kernel for every prefill chunk without an image.

A process-wide policy, as the CPU level is: the C kernels hold their half of it
(`ferry_qinvariant`: no AMX product from C either, as in the fused decode layers).
"""
from __future__ import annotations

from engine.kernels import native

_on = False


def batch_invariant() -> bool:
    """Whether products and attention now compute each row as it would be alone."""
    return _on


def set_batch_invariant(on: bool) -> bool:
    """Turn batch invariance on or off for the whole process; returns whether it now holds
    where asked (False: on was asked, but without Ferry's kernels torch's products run, which
    this cannot make invariant)."""
    global _on
    lib = native.library()
    _on = on
    if lib is not None:
        lib.ferry_qinvariant(int(on))
    return not on or lib is not None
