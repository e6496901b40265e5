"""Mistral 3 from GGUF, as llama.cpp's converter leaves it: the text model's file (a
`mistral3` one, Llama's layout, with Mistral's image tokens in its vocabulary) and a `pixtral`
projector file beside it (the tower's q and k rows in the converter's rotary order, F16
matrices, the patch merger). The seeded tiny Mistral 3 of the folder tests is written so:
Ferry pairs the projector, its weights and pictures' rows equal the folder's, and its greedy
replies and prompt counts through the API equal transformers' float32."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from engine.execution.loading.loader import load_model
from engine.execution.loading.projector_gguf import projector_beside
from tests.tools.hf_gguf import write_gguf
from tests.tools.mmproj_gguf import write_mistral3_mmproj
from tests.tools.synthetic_gguf import default_gguf
from tests.tools.tiny_llava import gguf_server, half_image_side, text_part
from tests.tools.tiny_mistral3 import IMAGE_BREAK, SPECIAL, assert_replies_equal, build


@pytest.fixture(scope="module")
def mistral3(tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """(the HF folder, transformers' model with its image side rounded to float16, as the
    projector file holds it: the reference for the GGUF)."""
    folder = tmp_path_factory.mktemp("mistral3-hf")
    model = build(folder, tokenizer)
    half_image_side(model)
    return folder, model


@pytest.fixture(scope="module")
def gguf(mistral3: tuple[Path, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import MistralForCausalLM

    _, model = mistral3
    store = tmp_path_factory.mktemp("mistral3-gguf")
    text = text_part(model, MistralForCausalLM)
    path = store / "tiny-mistral3-F32.gguf"
    write_gguf(path, text, tokenizer_of=default_gguf(), added=SPECIAL, arch="mistral3")
    write_mistral3_mmproj(store / "mmproj-tiny-mistral3-f16.gguf", model, IMAGE_BREAK)
    return path


def test_the_projector_makes_the_folders_model(mistral3: tuple[Path, Any], gguf: Path) -> None:
    folder, _ = mistral3
    assert projector_beside(gguf) == gguf.parent / "mmproj-tiny-mistral3-f16.gguf"
    from_hf = load_model(folder)
    from_gguf = load_model(gguf, projector=projector_beside(gguf))
    assert from_gguf.config.model_type == from_hf.config.model_type == "mistral3"
    ours, theirs = from_gguf.config.vision, from_hf.config.vision
    assert ours.tower == theirs.tower
    a, b = ours.processor, theirs.processor
    assert (a.longest_edge, a.unit, a.resample) == (b.longest_edge, b.unit, b.resample)
    # the file holds the mean and std as float32, which the pixels are normalized in
    assert np.array_equal(np.float32(a.mean), np.float32(b.mean))
    assert np.array_equal(np.float32(a.std), np.float32(b.std))
    assert ours.image_token_id == theirs.image_token_id
    got = from_gguf.state_dict()
    for key, value in from_hf.state_dict().items():
        torch.testing.assert_close(got[key].float(), value, rtol=1e-3, atol=1e-3, msg=key)
    pixels = torch.randn(2, 3, 48, 32, generator=torch.Generator().manual_seed(0))
    rows = from_gguf.encode_images(pixels)
    assert rows.shape == (2, 3 * 3, 64)  # 3 rows of 2 merged patches, each with its end
    torch.testing.assert_close(rows, from_hf.encode_images(pixels), rtol=1e-2, atol=1e-2)


@pytest.fixture(scope="module")
def served(gguf: Path, make_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    return gguf_server(make_server, gguf, "tiny-mistral3", tmp_path_factory.mktemp("tokenizers"))


@pytest.mark.parametrize("sizes", [[(50, 40)], [(17, 70)], [(90, 20), (40, 50)]],
                         ids=["landscape", "tall", "two"])
def test_replies_equal_transformers(served: Any, mistral3: tuple[Path, Any],
                                    sizes: list[tuple[int, int]]) -> None:
    assert_replies_equal(served, *mistral3, sizes)


def test_a_normed_projector_without_a_merger_is_refused(gguf: Path, tmp_path: Path) -> None:
    """Mistral 3's projector norms and merges, Pixtral 12B's does neither: one that norms
    without merging is neither, and is refused naming what it lacks."""
    import gguf as gguf_py

    from engine.execution.errors import ModelFileError
    from engine.execution.model.config import UnsupportedModel
    from tests.tools.mmproj_gguf import finish

    source = gguf_py.GGUFReader(projector_beside(gguf))
    out = gguf_py.GGUFWriter(str(tmp_path / "mmproj-no-merger.gguf"), "clip")
    for field in source.fields.values():
        if field.name.startswith("clip.") and field.types:
            kind = field.types[0]
            value = field.contents()
            if kind == gguf_py.GGUFValueType.ARRAY:
                out.add_array(field.name, value)
            else:
                out.add_key_value(field.name, value, kind)
    for t in source.tensors:
        if t.name != "mm.patch_merger.weight":
            out.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    finish(out)
    with pytest.raises((UnsupportedModel, ModelFileError), match=r"mm\.patch_merger"):
        load_model(gguf, projector=tmp_path / "mmproj-no-merger.gguf")
