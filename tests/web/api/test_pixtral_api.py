"""Pixtral 12B (a LLaVA folder over a Pixtral tower: its projector maps each patch, none
merged) through the API, from its Hugging Face folder and from GGUF as llama.cpp's converter
leaves it (a `llama` text file and a `pixtral` projector without `mm.patch_merger`): a seeded
random tiny one built by transformers offline, served for real. Greedy replies and
prompt-token counts equal transformers' float32 generate, each picture's rows of positions
ended by [IMG_BREAK] and the last by [IMG_END]."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine.execution.loading.loader import load_model
from engine.execution.loading.projector_gguf import projector_beside
from tests.tools.hf_gguf import write_gguf
from tests.tools.mmproj_gguf import write_mistral3_mmproj
from tests.tools.synthetic_gguf import default_gguf
from tests.tools.tiny_llava import chat_server, gguf_server, half_image_side, text_part
from tests.tools.tiny_mistral3 import (
    IMAGE_BREAK,
    IMAGE_END,
    IMAGE_TOKEN,
    PATCH,
    SPECIAL,
    assert_replies_equal,
    build,
)

NAME = "tiny-pixtral"


@pytest.fixture(scope="module")
def pixtral(tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    folder = tmp_path_factory.mktemp("pixtral")
    return folder, build(folder, tokenizer, pixtral=True)


@pytest.fixture(scope="module")
def server(pixtral: tuple[Path, Any], make_server: Any) -> Any:
    folder, _ = pixtral
    return chat_server(make_server, folder, model_name=NAME, max_images=2,
                       max_image_pixels=200 * 200)


# 50 x 40 fits as it is (5 rows of 7 patches of 8 pixels, each row ended); 90 x 20 is
# scaled down to fit 64 pixels
@pytest.mark.parametrize("sizes", [[(50, 40)], [(90, 20)], [(50, 40), (30, 80)]],
                         ids=["landscape", "wide", "two"])
def test_replies_equal_transformers(server: Any, pixtral: tuple[Path, Any],
                                    sizes: list[tuple[int, int]]) -> None:
    assert_replies_equal(server, *pixtral, sizes)


def test_each_patch_is_a_position(server: Any) -> None:
    config = server.engine.executor.model.config
    tower = config.vision.tower
    assert config.model_type == "mistral3" and not tower.patch_merger
    assert (tower.spatial_merge_size, tower.unit, tower.projector_bias) == (1, PATCH, True)
    assert (tower.break_token_id, tower.end_token_id) == (IMAGE_BREAK, IMAGE_END)
    assert config.vision.image_token_id == IMAGE_TOKEN
    assert server.engine.executor.describe().endswith(", text + images")


@pytest.fixture(scope="module")
def gguf(tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Any]:
    """(the GGUF text file with its projector beside it, the HF folder, transformers' model
    with its image side rounded to float16 as the projector file holds it)."""
    from transformers import MistralForCausalLM

    folder = tmp_path_factory.mktemp("pixtral-hf")
    model = build(folder, tokenizer, pixtral=True)
    half_image_side(model)
    store = tmp_path_factory.mktemp("pixtral-gguf")
    path = store / "tiny-pixtral-F32.gguf"
    write_gguf(path, text_part(model, MistralForCausalLM), tokenizer_of=default_gguf(),
               added=SPECIAL, arch="llama")
    write_mistral3_mmproj(store / "mmproj-tiny-pixtral-f16.gguf", model, IMAGE_BREAK)
    return path, folder, model


def test_gguf_makes_the_folders_model_and_replies_as_transformers(
        gguf: tuple[Path, Path, Any], make_server: Any,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    path, folder, model = gguf
    projector = projector_beside(path)
    assert projector is not None and projector.name == "mmproj-tiny-pixtral-f16.gguf"
    from_hf, from_gguf = load_model(folder), load_model(path, projector=projector)
    assert from_gguf.config.vision.tower == from_hf.config.vision.tower
    got = from_gguf.state_dict()
    for key, value in from_hf.state_dict().items():
        torch.testing.assert_close(got[key].float(), value, rtol=1e-3, atol=1e-3, msg=key)
    served = gguf_server(make_server, path, "tiny-pixtral-gguf",
                         tmp_path_factory.mktemp("tokenizers"))
    assert_replies_equal(served, folder, model, [(50, 40), (17, 70)])
