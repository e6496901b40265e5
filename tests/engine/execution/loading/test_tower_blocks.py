"""A GGUF vision model's image tower in blocks: where the text model runs in its own blocks
(CPU, dtype auto), the projector file's F16 matrices are quantized to Q8_0 once at load
(rows that are not whole blocks padded), a projector file in blocks keeps its own, and
`none` keeps the floats. The tower's rows stay near the float tower's."""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from engine.execution.loading.loader import GGUF, load_model
from engine.execution.model.describe import describe_weights
from engine.execution.model.layers import Linear
from engine.execution.model.linear_kernels import PaddedWeight
from engine.kernels import quant
from tests.tools import synthetic_gguf
from tests.tools.mmproj_gguf import finish, write_synthetic_qwen25vl_mmproj

GRID = (3, 4)  # merged positions; 4 patches each


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a synthetic Qwen2.5-VL text GGUF in Q8_0, its F16 projector file): a tower 64 wide
    whose MLP is 72 wide, not whole 32-value blocks."""
    folder = tmp_path_factory.mktemp("qwen-tower")
    text = folder / "qwen.gguf"
    synthetic_gguf.write(text, hidden=64, layers=1, ff=128, heads=2, kv_heads=1, head_dim=128,
                         qtype=gguf.GGMLQuantizationType.Q8_0, untied=False, arch="qwen2vl",
                         images=True, vocab_size=151_936)
    mmproj = folder / "mmproj-qwen-f16.gguf"
    write_synthetic_qwen25vl_mmproj(mmproj, 64, hidden=64, ff=72, layers=2, heads=2,
                                    full_every=2)
    return text, mmproj


def tower_linears(model: torch.nn.Module) -> dict[str, Linear]:
    return {n: m for n, m in model.named_modules()
            if isinstance(m, Linear) and n.startswith("visual.")}


def rows(model: torch.nn.Module) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    patches = torch.randn(1, GRID[0] * GRID[1] * 4, 3 * 2 * 14 * 14, generator=g)
    out: torch.Tensor = model.encode_images(patches, GRID)  # type: ignore[operator]
    return out


def test_an_f16_tower_is_quantized_to_q8_0_at_load(qwen: tuple[Path, Path]) -> None:
    text, mmproj = qwen
    blocks = load_model(text, quantize=GGUF, projector=mmproj, tower="q8_0")
    floats = load_model(text, quantize=GGUF, projector=mmproj, tower="none")
    linears = tower_linears(blocks)
    assert len(linears) == 2 * 5 + 2  # qkv, proj, gate, up, down a layer; the merger's two
    for name, module in linears.items():
        w = module.weight
        if name.endswith("down_proj"):  # 72 inputs: padded to 96
            assert isinstance(w, PaddedWeight) and w.blocks.in_features == 96, name
            w = w.blocks
        assert isinstance(w, quant.QuantWeight) and w.qtype == quant.Q8_0, name
    for name, module in tower_linears(floats).items():
        assert isinstance(module.weight, torch.Tensor), name
        assert module.weight.dtype == torch.float16, name
    got, want = rows(blocks), rows(floats)
    assert got.shape == want.shape == (1, GRID[0] * GRID[1], 64)
    cosine = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0)
    assert cosine > 0.999
    assert (got - want).norm() / want.norm() < 0.05
    # the text model is the file's blocks either way
    assert isinstance(blocks.model.layers[0].mlp.down_proj.weight, quant.QuantWeight)
    said = f", text + images (projector {mmproj.name}"
    assert describe_weights(blocks, "GGUF", mmproj).endswith(f"{said}, tower in Q8_0)")
    assert describe_weights(floats, "GGUF", mmproj).endswith(f"{said})")


def test_a_projector_file_in_blocks_keeps_its_own(qwen: tuple[Path, Path],
                                                   tmp_path: Path) -> None:
    """A projector file whose matrices llama-quantize left in Q8_0 multiplies those blocks
    as they are (no float copy, no second rounding); the ones it keeps float (rows not of
    whole blocks) are quantized at load as from F16."""
    text, mmproj = qwen
    source = gguf.GGUFReader(mmproj)
    out = gguf.GGUFWriter(str(tmp_path / "mmproj-qwen-q8_0.gguf"), "clip")
    for field in source.fields.values():
        if field.name.startswith(("clip.", "general.")) and field.types \
                and field.name != "general.architecture":
            if field.types[0] == gguf.GGUFValueType.ARRAY:
                out.add_array(field.name, field.contents())
            else:
                out.add_key_value(field.name, field.contents(), field.types[0])
    kept: dict[str, np.ndarray] = {}
    for t in source.tensors:
        data = np.asarray(t.data)
        if t.tensor_type == gguf.GGMLQuantizationType.F16 and data.ndim == 2 \
                and data.shape[1] % 32 == 0 and t.name == "v.blk.0.attn_out.weight":
            blocks = gguf.quants.quantize(data.astype(np.float32),
                                          gguf.GGMLQuantizationType.Q8_0)
            kept[t.name] = blocks
            out.add_tensor(t.name, blocks, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            out.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    finish(out)
    assert kept
    model = load_model(text, quantize=GGUF, projector=tmp_path / "mmproj-qwen-q8_0.gguf",
                       tower="q8_0")
    proj = tower_linears(model)["visual.blocks.0.attn.proj"].weight
    assert isinstance(proj, quant.QuantWeight) and proj.qtype == quant.Q8_0
    assert np.array_equal(proj.data.numpy(), kept["v.blk.0.attn_out.weight"])


def test_only_known_choices_load(qwen: tuple[Path, Path]) -> None:
    text, mmproj = qwen
    with pytest.raises(ValueError, match="one of q8_0, none"):
        load_model(text, quantize=GGUF, projector=mmproj, tower="q4_k")
