"""LLaVA 1.6 from GGUF, as llama.cpp's legacy scripts leave it: the text model's file (a
`llama` one, with `<image>` in its vocabulary) and an `mlp` projector file beside it that also
holds the pinpoints (width then height, as llama.cpp reads them) and `model.image_newline`.
The seeded tiny LLaVA-NeXT of the folder tests is written so: Ferry pairs the projector,
reads it as LLaVA 1.6 (not 1.5), its weights and pictures' rows equal the folder's, and its
greedy replies and prompt counts through the API equal transformers' float32."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine.execution.loading.loader import load_model
from engine.execution.loading.projector_gguf import projector_beside
from tests.tools.hf_gguf import write_gguf
from tests.tools.mmproj_gguf import write_llava_mmproj
from tests.tools.synthetic_gguf import default_gguf
from tests.tools.tiny_llava import gguf_server, half_image_side, text_part
from tests.tools.tiny_llava_next import assert_replies_equal, build


@pytest.fixture(scope="module")
def llava_next(tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """(the HF folder, transformers' model with its image side rounded to float16, as the
    projector file holds it: the reference for the GGUF)."""
    folder = tmp_path_factory.mktemp("llava-next-hf")
    model = build(folder, tokenizer)
    half_image_side(model)
    return folder, model


@pytest.fixture(scope="module")
def gguf(llava_next: tuple[Path, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import LlamaForCausalLM

    _, model = llava_next
    store = tmp_path_factory.mktemp("llava-next-gguf")
    text = text_part(model, LlamaForCausalLM)
    path = store / "tiny-llava-next-F32.gguf"
    write_gguf(path, text, tokenizer_of=default_gguf(), added=["<image>"])
    write_llava_mmproj(store / "mmproj-tiny-llava-next-f16.gguf", model)
    return path


def test_the_projector_makes_the_folders_model(llava_next: tuple[Path, Any],
                                                gguf: Path) -> None:
    folder, _ = llava_next
    assert projector_beside(gguf) == gguf.parent / "mmproj-tiny-llava-next-f16.gguf"
    from_hf = load_model(folder)
    from_gguf = load_model(gguf, projector=projector_beside(gguf))
    assert from_gguf.config.model_type == from_hf.config.model_type == "llava_next"
    ours, theirs = from_gguf.config.vision, from_hf.config.vision
    assert ours.processor.pinpoints == theirs.processor.pinpoints
    assert ours.tokens_per_image == theirs.tokens_per_image == 0
    got = from_gguf.state_dict()
    for key, value in from_hf.state_dict().items():
        torch.testing.assert_close(got[key].float(), value, rtol=1e-3, atol=1e-3, msg=key)
    tiles = torch.randn(2, 3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    batch = from_gguf.encode_images(tiles, size=(20, 60))
    torch.testing.assert_close(batch, from_hf.encode_images(tiles, size=(20, 60)),
                               rtol=1e-2, atol=1e-2)
    # two pictures of one size encode as one batch (the encoder's): each as it would alone
    for i in range(2):
        torch.testing.assert_close(batch[i], from_gguf.encode_images(tiles[i:i + 1],
                                                                     size=(20, 60))[0])


@pytest.fixture(scope="module")
def served(gguf: Path, make_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    return gguf_server(make_server, gguf, "tiny-llava-next", tmp_path_factory.mktemp("tokenizers"))


@pytest.mark.parametrize("sizes", [[(50, 40)], [(17, 70)], [(90, 20), (40, 50)]],
                         ids=["landscape", "tall", "two"])
def test_replies_equal_transformers(served: Any, llava_next: tuple[Path, Any],
                                    sizes: list[tuple[int, int]]) -> None:
    assert_replies_equal(served, *llava_next, sizes)
