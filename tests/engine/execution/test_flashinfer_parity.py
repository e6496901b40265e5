"""FlashInfer backend vs the torch reference on the same pool and weights (CUDA only)."""
from __future__ import annotations

import importlib.util
import random

import pytest
import torch

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("flashinfer") is None,
                       reason="needs flashinfer-python"),
]


@pytest.mark.parametrize("arch", ["llama3", "qwen3"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_flashinfer_matches_torch_backend(tiny_models, make_harness, arch: str,
                                          page_size: int) -> None:
    tiny = tiny_models[arch]
    kw = {"page_size": page_size, "dtype": torch.bfloat16, "device": "cuda"}
    ref, fi = make_harness(tiny.path, backend="torch", **kw), \
        make_harness(tiny.path, backend="flashinfer", **kw)
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 320) for _ in range(n)] for n in (1, 5, 17, 40)]
    for h in (ref, fi):
        reqs = [h.new(p) for p in prompts]
        h.round([(reqs[0], 0, 1, True), (reqs[1], 0, 5, True), (reqs[2], 0, 9, False)])
        h.round([(reqs[0], 1, 1, True), (reqs[1], 5, 1, True), (reqs[2], 9, 8, True),
                 (reqs[3], 0, 40, True)], "mixed")
        for _ in range(4):  # pure decode rounds use the decode wrapper
            h.round([(r, r.num_tokens - 1, 1, True) for r in reqs], "decode")
        h.reqs = reqs  # type: ignore[attr-defined]
    for a, b in zip(ref.reqs, fi.reqs):  # type: ignore[attr-defined]
        assert a.output_ids == b.output_ids
        for pos, row in ref.logits[a.id].items():
            torch.testing.assert_close(fi.logits[b.id][pos], row, atol=5e-2, rtol=5e-2)
