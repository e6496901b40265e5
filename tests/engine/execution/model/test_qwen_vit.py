"""Qwen2.5-VL's vision tower equals transformers' on the same random weights (float32): its
windows (grids that divide into them and grids that do not), its full-attention layers, its
2D rotary and the merger; and the window bookkeeping equals transformers' on its own."""
from __future__ import annotations

import pytest
import torch

from engine.execution.model.vision import QwenVisionTower, QwenViTConfig
from engine.execution.model.vision.qwen_vit import window_order

# windows of 56 pixels: 2 x 2 merge groups, 4 x 4 patches
HF_CONFIG = {"depth": 4, "hidden_size": 32, "num_heads": 4, "intermediate_size": 64,
             "out_hidden_size": 48, "window_size": 56, "fullatt_block_indexes": [1, 3],
             "patch_size": 14, "temporal_patch_size": 2, "spatial_merge_size": 2,
             "hidden_act": "silu", "in_chans": 3}


@pytest.fixture(scope="module")
def towers() -> tuple[torch.nn.Module, QwenVisionTower]:
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
        Qwen2_5_VisionTransformerPretrainedModel,
    )

    torch.manual_seed(0)
    hf = Qwen2_5_VisionTransformerPretrainedModel(Qwen2_5_VLVisionConfig(**HF_CONFIG)).eval()
    with torch.no_grad():  # every weight random, norms around 1, so no layer is a no-op
        for name, p in hf.named_parameters():
            # outputs of about 1, so that float32's rounding stays well under atol
            scale = 0.05 if name.startswith(("patch_embed.", "merger.mlp.2")) else 0.2
            p.copy_(torch.randn_like(p) * scale + (1.0 if "norm" in name or "ln_q" in name
                                                   else 0.0))
    ours = QwenVisionTower(QwenViTConfig.from_hf(HF_CONFIG), torch.float32, "cpu")
    ours.load_state_dict(hf.state_dict(), strict=True)
    return hf, ours.eval()


def test_config_reads_both_spellings() -> None:
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig

    # the checkpoint's config.json (transformers 4 read it as it is), transformers 5's dict
    # of it, and the names transformers 5 maps onto the checkpoint's
    v4 = {**HF_CONFIG, "spatial_patch_size": 14, "tokens_per_second": 2}
    v5 = Qwen2_5_VLVisionConfig(**HF_CONFIG).to_dict()
    del v5["in_chans"]
    mapped = {**{k: v for k, v in HF_CONFIG.items() if k not in ("depth", "num_heads")},
              "num_hidden_layers": 4, "num_attention_heads": 4}
    cfg = QwenViTConfig.from_hf(v4)
    assert QwenViTConfig.from_hf(v5) == cfg == QwenViTConfig.from_hf(mapped)
    assert (cfg.depth, cfg.num_heads, cfg.head_dim, cfg.window_groups, cfg.patch_dim) \
        == (4, 4, 8, 2, 1176)
    assert cfg.fullatt_block_indexes == (1, 3) and cfg.rope_theta == 10000.0
    assert QwenViTConfig.from_hf({"rope_parameters": {"rope_theta": 500.0}}).rope_theta == 500.0
    three_b = QwenViTConfig.from_hf({})  # Qwen2.5-VL 3B's
    assert (three_b.depth, three_b.hidden_size, three_b.num_heads, three_b.out_hidden_size,
            three_b.window_size, three_b.fullatt_block_indexes) \
        == (32, 1280, 16, 2048, 112, (7, 15, 23, 31))


def test_window_order_by_hand() -> None:
    # 4 x 6 patches: 2 x 3 merge groups 0 1 2 / 3 4 5; windows of 2 x 2 groups: {0 1 3 4}, {2 5}
    order, lengths = window_order(4, 6, 2, 2)
    assert order.tolist() == [0, 1, 3, 4, 2, 5]
    assert lengths == (16, 8)
    order, lengths = window_order(6, 6, 2, 2)  # 3 x 3 groups: four windows, three cut short
    assert order.tolist() == [0, 1, 3, 4, 2, 5, 6, 7, 8]
    assert lengths == (16, 8, 8, 4)
    with pytest.raises(ValueError):
        window_order(5, 6, 2, 2)


@pytest.mark.parametrize("grid", [(8, 12), (4, 4), (12, 6), (10, 14), (16, 16), (34, 46)])
@pytest.mark.parametrize("window", [2, 4])
def test_window_order_equals_transformers(grid: tuple[int, int], window: int) -> None:
    from transformers.vision_utils import get_vision_window_index

    rows, cols = grid
    want_order, cu = get_vision_window_index(torch.tensor([[1, rows, cols]]), 2, window * 28, 14)
    order, lengths = window_order(rows, cols, 2, window)
    assert order.tolist() == want_order.tolist()
    assert list(lengths) == torch.diff(cu).tolist()


@pytest.mark.parametrize("grid", [(8, 12), (4, 4), (12, 6), (10, 14), (16, 16)])
def test_tower_equals_transformers(towers: tuple[torch.nn.Module, QwenVisionTower],
                                   grid: tuple[int, int]) -> None:
    hf, ours = towers
    rows, cols = grid
    torch.manual_seed(rows * 100 + cols)
    patches = torch.randn(rows * cols, 3 * 2 * 14 * 14)
    with torch.inference_mode():
        want = hf(patches, grid_thw=torch.tensor([[1, rows, cols]])).pooler_output
        got = ours(patches, grid)
    assert got.shape == (rows * cols // 4, 48)
    assert want.std() > 0.1  # not a trivial output
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_windows_matter(towers: tuple[torch.nn.Module, QwenVisionTower]) -> None:
    # a patch in one window changes the other windows' rows only through the full layers:
    # with those made windowed too, the rows of the other windows stay as they were
    _, ours = towers
    torch.manual_seed(1)
    patches = torch.randn(8 * 8, 3 * 2 * 14 * 14)
    changed = patches.clone()
    changed[0] += 1.0  # merge group 0, in the top-left window of groups {0, 1, 4, 5}
    others = [2, 3, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
    with torch.inference_mode():
        before, after = ours(patches, (8, 8)), ours(changed, (8, 8))
        assert not torch.allclose(before[others], after[others])
        windowed = QwenVisionTower(QwenViTConfig.from_hf({**HF_CONFIG,
                                                          "fullatt_block_indexes": []}),
                                   torch.float32, "cpu")
        windowed.load_state_dict(ours.state_dict())
        before, after = windowed(patches, (8, 8)), windowed(changed, (8, 8))
        torch.testing.assert_close(before[others], after[others])
        assert not torch.allclose(before[[0, 1, 4, 5]], after[[0, 1, 4, 5]])
