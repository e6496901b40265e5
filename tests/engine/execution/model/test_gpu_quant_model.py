"""A GGUF loaded for a GPU keeps its blocks in device memory (engine.kernels.gpu_quant): on a
CUDA GPU where there is one, else run by Triton's interpreter on CPU tensors (the load a CUDA
device gets, the same kernels).

Against the float32 reference (the same file dequantised by gguf-py's arithmetic): a whole
model's forward on a small synthetic GGUF (the interpreter is far too slow for the default
model's 49152-row LM head), and the default model's own Q4_1 projections and Q8_0 embedding
table, layer 0. Dequantisation is exact both ways, so the differences are float32 rounding.
"""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from pathlib import Path

import pytest
from gguf import GGMLQuantizationType

from engine.config import EngineConfig
from engine.execution.executor import ModelExecutor
from engine.execution.footprint import weight_bytes
from engine.execution.loading import loader
from engine.execution.loading.loader import GGUF_DEVICE, load_model, weight_mode
from engine.execution.model.describe import describe_weights
from engine.kernels import gpu_quant
from tests.tools import synthetic_gguf
from tests.tools.harness import Harness

pytest.importorskip("triton", reason="the gpu_quant kernels need Triton (the dev extra)")
DEVICE = "cpu" if gpu_quant.interpreted() else "cuda"
if gpu_quant.unusable_reason(DEVICE):
    pytest.skip(f"{gpu_quant.unusable_reason(DEVICE)}", allow_module_level=True)

VOCAB = 320  # a small head: the interpreter runs each of its tiles in Python


@pytest.fixture(scope="module", params=["llama", "qwen3moe"])
def small_gguf(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2-layer GGUFs with a small vocabulary and no tokenizer (the forward needs none): a
    Llama in Q4_1 with its head tied to the embedding (attn_q / attn_k rows reordered at
    load), a Qwen3-MoE in Q8_0 (4 experts, 2 a token; q/k norms) with its own head."""
    arch = request.param
    path = tmp_path_factory.mktemp("gguf") / f"small-{arch}.gguf"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(synthetic_gguf, "copy_tokenizer", lambda writer, source, *_, **__: VOCAB)
        if arch == "llama":
            synthetic_gguf.write(path, hidden=64, layers=2, ff=96, heads=4, kv_heads=2,
                                 qtype=GGMLQuantizationType.Q4_1, untied=False)
        else:
            synthetic_gguf.write(path, hidden=64, layers=2, ff=32, heads=4, kv_heads=2,
                                 qtype=GGMLQuantizationType.Q8_0, untied=True, arch=arch,
                                 head_dim=16, experts=4, top_k=2)
    return path


def test_a_gguf_on_cuda_keeps_its_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    path = loader.default_gguf_path()
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert weight_mode(path, "auto", "cuda") == (torch.bfloat16, GGUF_DEVICE)
    assert weight_mode(path, "float16", "cuda") == (torch.float16, GGUF_DEVICE)
    assert weight_mode(path, "auto", "cpu") == (torch.float32, loader.GGUF)  # unchanged
    monkeypatch.setattr(gpu_quant, "unusable_reason", lambda device: "Triton is not installed")
    assert weight_mode(path, "auto", "cuda") == (torch.bfloat16, None)  # dequantised


def test_kernels_failing_their_self_test_mean_a_dequantised_load(
        small_gguf: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A device whose kernels compute wrongly (a fault injected: every product zero) gets the
    float weights, with the reason in the log, instead of wrong answers every round."""
    from engine.kernels.gpu_quant import launch, probe

    def zeros(x: torch.Tensor, weight: gpu_quant.DeviceQuantWeight,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        return torch.zeros(x.shape[0], weight.out_features, dtype=x.dtype, device=x.device)

    probe.failure.cache_clear()
    monkeypatch.setattr(launch, "matmul", zeros)
    try:
        model = load_model(small_gguf, torch.float32, DEVICE, GGUF_DEVICE)
    finally:
        probe.failure.cache_clear()
    assert not model.device_quantized
    assert isinstance(model.lm_head.weight, torch.Tensor)
    assert "failed its self-test" in caplog.text


def _logits(model: torch.nn.Module, prompt: list[int]) -> dict[int, torch.Tensor]:
    """Logits of a prefill and two greedy decode steps, by position."""
    cfg = EngineConfig(page_size=4, kv_tokens=256, max_running=4,
                       kv_dtype="float32")  # type: ignore[arg-type]
    harness = Harness(ModelExecutor(model, cfg, DEVICE, backend="torch"))  # type: ignore[arg-type]
    req = harness.new(prompt)
    harness.prefill([req])
    harness.decode([req], 2)
    return harness.logits[req.id]


def test_forward_on_device_blocks_matches_the_dequantised_model(small_gguf: Path) -> None:
    blocks = load_model(small_gguf, torch.float32, DEVICE, GGUF_DEVICE)
    blocks.pack_weights()
    assert blocks.device_quantized and not blocks.quantized
    assert isinstance(blocks.lm_head.weight, gpu_quant.DeviceQuantWeight)
    if blocks.config.tie_word_embeddings:
        assert blocks.lm_head.weight is blocks.model.embed_tokens.weight
    reference = load_model(small_gguf, torch.float32, DEVICE, None)
    got, want = _logits(blocks, [1, 5, 9, 200, 300, 7]), _logits(reference, [1, 5, 9, 200,
                                                                               300, 7])
    assert sorted(got) == sorted(want) == [5, 6, 7]
    for pos in want:
        torch.testing.assert_close(got[pos], want[pos], rtol=1e-5, atol=1e-5)
    # the blocks are what the device holds: under a third of the float32 weights
    assert weight_bytes(blocks) * 3 < weight_bytes(reference)


@pytest.mark.model
def test_default_model_layer_products_on_device_blocks() -> None:
    """The default file's own blocks (Q4_1 projections, Q8_0 embedding and tied head): layer
    0's products at decode and prefill row counts, and embedding rows."""
    path = loader.default_gguf_path()
    blocks = load_model(path, torch.float32, DEVICE, GGUF_DEVICE)
    reference = load_model(path, torch.float32, DEVICE, None)
    assert describe_weights(blocks, "GGUF") == \
        "llama: GGUF Q4_1 + Q8_0 head, Triton block kernels on the GPU, 97 MB"
    layer, ref_layer = blocks.model.layers[0], reference.model.layers[0]
    gen = torch.Generator().manual_seed(0)
    # one decode product (the broadcast path), one prefill product (tl.dot)
    for name, rows in (("self_attn.qkv_proj", 1), ("self_attn.o_proj", 5)):
        module, ref = layer.get_submodule(name), ref_layer.get_submodule(name)
        assert isinstance(module.weight, gpu_quant.DeviceQuantWeight)
        assert module.weight.type_names == ("Q4_1",)
        x = torch.randn(rows, module.weight.in_features, generator=gen, device="cpu")
        want = torch.nn.functional.linear(x.double(), ref.weight.double().cpu())
        scale = float(want.abs().max())
        got = module(x.to(DEVICE)).double().cpu()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * scale)
    ids = torch.tensor([0, 17, 49151, 17], device=DEVICE)
    embed = blocks.model.embed_tokens
    assert embed.weight.type_names == ("Q8_0",)  # type: ignore[union-attr]
    assert torch.equal(embed(ids), reference.model.embed_tokens(ids))
    # about the file's size on the device; the float32 model takes ~4x (bf16 would take ~2x)
    from engine.execution.loading.gguf_file import GGUFFile

    size = GGUFFile(path).total_bytes()
    assert size * 0.95 < weight_bytes(blocks) < size * 1.1
    assert weight_bytes(reference) > 3 * size
