"""LLaVA from GGUF, as llama.cpp's legacy scripts leave LLaVA 1.5: the text model's file (a
`llama` one, with SmolLM2's tokenizer here) and the `mlp` projector file beside it, its tower
cut to the feature layer, its matrices F16. The seeded tiny LLaVA of the folder tests is
written both ways: with `<image>` in the text file's vocabulary (converted from a
transformers folder) and without it (converted from the original checkpoint). Either way
Ferry pairs the projector itself, its weights equal the folder's, and its greedy replies and
prompt counts through the API equal transformers' float32."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.execution.loading.loader import load_model
from engine.execution.loading.projector_gguf import projector_beside
from engine.execution.model.config import UnsupportedModel
from tests.tools.hf_gguf import write_gguf
from tests.tools.mmproj_gguf import write_llava_mmproj
from tests.tools.synthetic_gguf import default_gguf
from tests.tools.tiny_llava import (
    IMAGE_TOKEN,
    TOKENS_PER_IMAGE,
    ask,
    assert_idle,
    build,
    content,
    half_image_side,
    png,
    reference,
)

TEXT = "What is in the picture?"


@pytest.fixture(scope="module")
def llava(tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """(the HF folder, transformers' model with its image side rounded to float16, as the
    projector file holds it: the reference for the GGUF)."""
    folder = tmp_path_factory.mktemp("llava-hf")
    model = build(folder, tokenizer)
    half_image_side(model)
    return folder, model


def write_store(model: Any, store: Path, with_image_token: bool) -> Path:
    """An LM Studio-style folder: the text GGUF and its mmproj beside it."""
    from transformers import LlamaForCausalLM

    text = LlamaForCausalLM(model.config.text_config).eval()
    text.model.load_state_dict(model.model.language_model.state_dict())
    text.lm_head.load_state_dict(model.lm_head.state_dict())
    gguf = store / "tiny-llava-F32.gguf"
    write_gguf(gguf, text, tokenizer_of=default_gguf(),
               added=["<image>"] if with_image_token else [])
    write_llava_mmproj(store / "mmproj-tiny-llava-f16.gguf", model)
    return gguf


@pytest.fixture(scope="module", params=[True, False], ids=["image-token", "original-vocab"])
def store(request: pytest.FixtureRequest, llava: tuple[Path, Any],
          tmp_path_factory: pytest.TempPathFactory) -> tuple[bool, Path]:
    with_token = bool(request.param)
    return with_token, write_store(llava[1], tmp_path_factory.mktemp("llava-gguf"), with_token)


def test_the_projector_makes_the_folders_model(llava: tuple[Path, Any],
                                                store: tuple[bool, Path]) -> None:
    folder, _ = llava
    with_token, gguf = store
    assert projector_beside(gguf) == gguf.parent / "mmproj-tiny-llava-f16.gguf"
    from_hf = load_model(folder)
    from_gguf = load_model(gguf, projector=projector_beside(gguf))
    ours, theirs = from_gguf.config.vision, from_hf.config.vision
    assert theirs.tower.layers == 2 and theirs.tokens_per_image == TOKENS_PER_IMAGE
    assert theirs.image_token_id == IMAGE_TOKEN
    # without `<image>` in the vocabulary, the prompt is split around the placeholder; the
    # file holds the processor's mean and std as float32
    assert ours.processor.mean == pytest.approx(theirs.processor.mean, abs=1e-7)
    assert ours.processor.std == pytest.approx(theirs.processor.std, abs=1e-7)
    assert replace(ours, processor=theirs.processor) == (
        theirs if with_token else replace(theirs, image_token_id=0, split_at_placeholder=True))
    got = from_gguf.state_dict()
    for key, value in from_hf.state_dict().items():
        torch.testing.assert_close(got[key].float(), value, rtol=1e-3, atol=1e-3, msg=key)
    pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(from_gguf.encode_images(pixels), from_hf.encode_images(pixels),
                               rtol=1e-2, atol=1e-2)


@pytest.fixture(scope="module")
def served(store: tuple[bool, Path], make_server: Any,
           tmp_path_factory: pytest.TempPathFactory) -> Any:
    from engine import EngineConfig, ModelExecutor, Tokenizer

    _, gguf = store
    fields: dict[str, Any] = {"page_size": 4, "kv_tokens": 4096, "max_context": 512,
                              "kv_dtype": "float32"}
    executor = ModelExecutor.from_pretrained(gguf, EngineConfig(**fields),
                                             dtype=torch.float32, threads=1)
    assert executor.describe().endswith(
        ", text + images (projector mmproj-tiny-llava-f16.gguf)")
    tokenizer = Tokenizer(gguf, tmp_path_factory.mktemp("tokenizers"))
    return make_server(web={"model_name": "tiny-llava", "max_images": 2}, executor=executor,
                       tokenizer_override=tokenizer, **fields)


@pytest.mark.parametrize("count", [1, 2])
def test_replies_equal_transformers(served: Any, llava: tuple[Path, Any], count: int) -> None:
    folder, model = llava
    images = [png(seed) for seed in range(count)]
    r = ask(served, content(TEXT, images))
    assert r.status_code == 200, r.text
    prompt_tokens, reply = reference(folder, model, TEXT, images, 6)
    body = r.json()
    assert body["usage"]["prompt_tokens"] == prompt_tokens
    assert body["choices"][0]["message"]["content"] == reply
    assert_idle(served)


def test_the_placeholder_typed_in_the_text_is_a_400(served: Any) -> None:
    r = ask(served, content(f"{TEXT} <image>", [png(0)]))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_image_placement"
    assert_idle(served)


def test_a_projector_with_more_than_one_feature_layer_is_refused(
        llava: tuple[Path, Any], tmp_path: Path) -> None:
    import gguf as gguf_py

    _, model = llava
    text = write_store(model, tmp_path, True)
    projector = tmp_path / "mmproj-tiny-llava-f16.gguf"
    reader = gguf_py.GGUFReader(projector)
    w = gguf_py.GGUFWriter(str(tmp_path / "mmproj-two-layers.gguf"), "clip")
    for key, field in reader.fields.items():
        if key.startswith("clip."):
            w.add_key_value(key, field.contents(), field.types[0],
                            field.types[1] if len(field.types) > 1 else None)
    w.add_array("clip.vision.feature_layer", [1, 2])
    for t in reader.tensors:
        w.add_tensor(t.name, t.data.reshape([int(d) for d in reversed(t.shape.tolist())]),
                     raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedModel, match=r"features from layers \[1, 2\]"):
        load_model(text, projector=tmp_path / "mmproj-two-layers.gguf")
