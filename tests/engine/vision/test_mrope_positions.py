"""M-RoPE's (time, row, column) positions, as Qwen2-VL numbers a prompt with images: checked
against transformers' own get_rope_index for whole prompts, and chunked: any [start, end)
gives the same numbers as the whole prompt's slice. Pure bookkeeping, no model."""
from __future__ import annotations

from typing import Any

import pytest
import torch

from engine.vision import ImageInput, mrope_positions

IMAGE = 7


def prompt(layout: list[Any]) -> tuple[list[int], tuple[ImageInput, ...]]:
    """`layout`: ints are runs of text tokens, (rows, cols) an image's grid."""
    ids: list[int] = []
    images = []
    for part in layout:
        if isinstance(part, int):
            ids.extend([1] * part)
        else:
            rows, cols = part
            images.append(ImageInput(f"{len(images):x}" * 8, None, len(ids), rows * cols,
                                     grid=(rows, cols)))
            ids.extend([IMAGE] * (rows * cols))
    return ids, tuple(images)


def transformers_positions(ids: list[int], images: tuple[ImageInput, ...]) -> list[list[int]]:
    from transformers import Qwen2_5_VLConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel

    config = Qwen2_5_VLConfig(vision_config={"spatial_merge_size": 2})
    model: Any = Qwen2_5_VLModel.__new__(Qwen2_5_VLModel)  # get_rope_index reads config only
    model.config = config
    grids = torch.tensor([[1, 2 * i.grid[0], 2 * i.grid[1]] for i in images if i.grid])
    tensor = torch.tensor([ids])
    positions, _ = model.get_rope_index(tensor, (tensor == IMAGE).int(),
                                        image_grid_thw=grids if len(images) else None)
    return [plane[0].tolist() for plane in positions]


LAYOUTS = [
    [5, (2, 3), 4],
    [3, (4, 1), 2, (1, 5), 6],
    [(3, 3), 1],
    [2, (2, 2), 1, (3, 4), 3],  # images apart, as their tags keep them
]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_positions_equal_transformers(layout: list[Any]) -> None:
    ids, images = prompt(layout)
    assert [list(p) for p in mrope_positions(images, 0, len(ids))] == \
        transformers_positions(ids, images)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_any_chunk_is_the_whole_prompts_slice(layout: list[Any]) -> None:
    ids, images = prompt(layout)
    whole = mrope_positions(images, 0, len(ids) + 4)  # and 4 generated tokens after it
    for start in range(len(ids) + 4):
        for end in range(start, len(ids) + 5):
            part = mrope_positions(images, start, end)
            assert [p for p in part] == [w[start:end] for w in whole], (start, end)


def test_text_after_images_continues_from_the_largest_position() -> None:
    ids, images = prompt([2, (3, 5), 1])
    time, row, col = mrope_positions(images, len(ids), len(ids) + 2)
    # the image starts at 2 and spans columns 2..6; the closing token takes 7, then 8, 9
    assert time == row == col == [8, 9]


def test_without_grids_positions_are_plain() -> None:
    image = ImageInput("ab" * 8, None, 2, 4)  # a fixed-size image family: no grid
    assert mrope_positions([image], 0, 8) == (list(range(8)),) * 3
