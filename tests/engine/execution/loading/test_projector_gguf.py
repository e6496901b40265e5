"""A GGUF vision model as llama.cpp and LM Studio keep it: the text model's file and its
projector file (`mmproj`, architecture `clip`) beside it. Written here from the seeded tiny
Gemma 3 by llama.cpp's names and keys (tests/tools/mmproj_gguf.py; the opt-in
tests/web/api/test_vision_llama_cpp_files.py takes llama.cpp's own converter): Ferry pairs
the projector by itself, reads the same model as from the Hugging Face folder (config,
weights, image rows), puts right an older file's swapped FFN, and refuses a projector that
does not fit the model, saying why."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.execution.errors import ModelFileError
from engine.execution.loading.loader import load_model, vision_of
from engine.execution.loading.projector_gguf import ProjectorFile, projector_beside
from engine.execution.model.describe import describe_file
from tests.tools import tiny_gemma3
from tests.tools.hf_gguf import write_gguf
from tests.tools.mmproj_gguf import write_gemma3_mmproj


@pytest.fixture(scope="module")
def tiny(tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the HF folder, an LM Studio-style folder: the text GGUF and mmproj-*.gguf)."""
    from transformers import Gemma3ForCausalLM

    folder = tmp_path_factory.mktemp("gemma3-hf")
    hf = tiny_gemma3.build(folder, tokenizer)
    text = Gemma3ForCausalLM(hf.config.text_config).eval()
    text.model.load_state_dict(hf.model.language_model.state_dict())
    vocab = hf.config.text_config.vocab_size
    tokens = [f"<t{i}>" for i in range(vocab)]
    for i, special in enumerate(tiny_gemma3.SPECIAL):
        tokens[tiny_gemma3.BOI + i] = special
    store = tmp_path_factory.mktemp("gemma3-gguf")
    write_gguf(store / "tiny-gemma3-F32.gguf", text, tokens=tokens)
    write_gemma3_mmproj(store / "mmproj-tiny-gemma3-f32.gguf", hf, tiny_gemma3.TOKENS_PER_IMAGE)
    return folder, store


def _models(tiny: tuple[Path, Path], projector: Path | None = None) -> tuple[Any, Any]:
    folder, store = tiny
    return load_model(folder), load_model(store / "tiny-gemma3-F32.gguf", projector=projector)


def test_the_projector_beside_makes_the_same_vision_model(tiny: tuple[Path, Path]) -> None:
    folder, store = tiny
    gguf = store / "tiny-gemma3-F32.gguf"
    assert projector_beside(gguf) == store / "mmproj-tiny-gemma3-f32.gguf"
    from_hf = load_model(folder)
    from_gguf = load_model(gguf, projector=projector_beside(gguf))
    assert from_gguf.config.vision == from_hf.config.vision
    assert vision_of(gguf) == from_hf.config.vision  # before loading, as the model set asks
    theirs = from_gguf.state_dict()
    for key, value in from_hf.state_dict().items():
        torch.testing.assert_close(theirs[key], value, rtol=1e-6, atol=1e-6, msg=key)
    pixels = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(from_gguf.encode_images(pixels), from_hf.encode_images(pixels))
    assert describe_file(gguf).endswith(
        ", text + images (projector mmproj-tiny-gemma3-f32.gguf)")


def test_an_older_file_with_swapped_ffn_reads_the_same(tiny: tuple[Path, Path],
                                                       tmp_path: Path) -> None:
    folder = tiny[0]
    from transformers import Gemma3ForConditionalGeneration

    hf = Gemma3ForConditionalGeneration.from_pretrained(folder)
    swapped = tmp_path / "mmproj-swapped.gguf"
    write_gemma3_mmproj(swapped, hf, tiny_gemma3.TOKENS_PER_IMAGE, swap_ffn=True)
    assert "v.blk.0.ffn_up.weight" in ProjectorFile(swapped).tensors
    from_hf, from_gguf = _models(tiny, swapped)
    pixels = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(from_gguf.encode_images(pixels), from_hf.encode_images(pixels))


def test_an_f16_projector_keeps_its_matrices_as_the_file_stores_them(
        tiny: tuple[Path, Path], tmp_path: Path) -> None:
    """The tower's F16 matrices stay float16 (the file's bytes, not a float32 copy twice
    their size) and give the rows that the same values in float32 give."""
    from transformers import Gemma3ForConditionalGeneration

    from engine.execution.model.layers.linear import Linear

    hf = Gemma3ForConditionalGeneration.from_pretrained(tiny[0])
    with torch.no_grad():  # values a float16 holds exactly, so both files hold the same
        for name, p in hf.named_parameters():
            if "vision_tower" in name and p.ndim == 2:
                p.copy_(p.half().float())
    wide, half = tmp_path / "mmproj-f32.gguf", tmp_path / "mmproj-f16.gguf"
    write_gemma3_mmproj(wide, hf, tiny_gemma3.TOKENS_PER_IMAGE)
    write_gemma3_mmproj(half, hf, tiny_gemma3.TOKENS_PER_IMAGE, half=True)
    _, from_wide = _models(tiny, wide)
    _, from_half = _models(tiny, half)
    tower = [m for m in from_half.vision_tower.modules() if isinstance(m, Linear)]
    assert tower and all(m.weight.dtype == torch.float16 for m in tower)
    pixels = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(from_half.encode_images(pixels),
                               from_wide.encode_images(pixels), rtol=1e-5, atol=1e-5)


def test_which_projector_beside_a_model_pairs(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    """An F16 one first among several; none of a kind Ferry does not run, nor for another
    architecture (the model then serves text, as before)."""
    _, store = tiny
    gguf = tmp_path / "model.gguf"
    shutil.copy(store / "tiny-gemma3-F32.gguf", gguf)
    assert projector_beside(gguf) is None
    for name in ("mmproj-b-f32.gguf", "mmproj-a-f16.gguf"):
        shutil.copy(store / "mmproj-tiny-gemma3-f32.gguf", tmp_path / name)
    assert projector_beside(gguf) == tmp_path / "mmproj-a-f16.gguf"
    (tmp_path / "mmproj-a-f16.gguf").write_bytes(b"GGUF not really")
    assert projector_beside(gguf) == tmp_path / "mmproj-b-f32.gguf"


def test_a_projector_that_does_not_fit_is_refused(tiny: tuple[Path, Path],
                                                  model_dir: Path) -> None:
    _, store = tiny
    mmproj = store / "mmproj-tiny-gemma3-f32.gguf"
    default = model_dir if model_dir.is_file() else next(model_dir.glob("*.gguf"))
    with pytest.raises(ModelFileError, match="goes with a gemma3 model"):
        load_model(default, projector=mmproj)
    assert projector_beside(default) is None  # nothing of the kind beside it
    with pytest.raises(ModelFileError, match="architecture 'clip'"):
        ProjectorFile(store / "tiny-gemma3-F32.gguf")
    with pytest.raises(ValueError, match="projector file goes with a GGUF"):
        load_model(tiny[0], projector=mmproj)


def test_mmproj_names_the_projector_for_the_one_model(tiny: tuple[Path, Path],
                                                      tmp_path: Path) -> None:
    """`--mmproj PATH` (setting `mmproj`): the projector of the model served, checked to be
    a projector file at start; not with several models, nor for a folder."""
    from app.cli import build_parser, serve_flags
    from app.config_sources import load_settings
    from app.models import ModelError
    from app.preflight import served_models
    from app.settings import SettingsError

    folder, store = tiny
    gguf, mmproj = store / "tiny-gemma3-F32.gguf", store / "mmproj-tiny-gemma3-f32.gguf"

    (tmp_path / "ferry.toml").write_text("")

    def settings(*argv: str) -> Any:
        args = build_parser().parse_args(["serve", *argv])
        return load_settings(serve_flags(args), env={"FERRY_HOME": str(tmp_path)},
                             config_file=tmp_path / "ferry.toml")

    refs = served_models(settings("--model", str(gguf), "--mmproj", str(mmproj)))
    assert refs[0].projector == mmproj.resolve()
    with pytest.raises(ModelError, match="not a projector file"):
        served_models(settings("--model", str(gguf), "--mmproj", str(gguf)))
    with pytest.raises(ModelError, match="no projector file"):
        served_models(settings("--model", str(gguf), "--mmproj", str(tmp_path / "x.gguf")))
    with pytest.raises(ModelError, match=r"pairs with a \.gguf model"):
        served_models(settings("--model", str(folder), "--mmproj", str(mmproj)))
    with pytest.raises(SettingsError, match="one model"):
        settings("--model", str(gguf), "--model", "default", "--mmproj", str(mmproj))


def test_joined_tensors_stay_float16_where_all_parts_are(tmp_path: Path) -> None:
    """Qwen2.5-VL's q, k and v, kept apart by llama.cpp's converter, join into one qkv in
    the file's F16; F32 parts (the biases) join as float32."""
    import numpy as np

    from tests.tools.mmproj_gguf import write_synthetic_qwen25vl_mmproj

    path = tmp_path / "mmproj-qwen.gguf"
    write_synthetic_qwen25vl_mmproj(path, 16, hidden=8, ff=12, layers=1, heads=2)
    projector = ProjectorFile(path)
    names = [f"v.blk.0.attn_{x}.weight" for x in "qkv"]
    qkv = projector.joined(names, 0)
    assert qkv.data.dtype == np.float16 and qkv.shape == (24, 8)
    np.testing.assert_array_equal(qkv.data[8:16], projector.tensors[names[1]].data)
    biases = projector.joined([f"v.blk.0.attn_{x}.bias" for x in "qkv"], 0)
    assert biases.data.dtype == np.float32 and biases.shape == (24,)
    with pytest.raises(ModelFileError, match=r"attn_z\.weight is missing"):
        projector.joined(["v.blk.0.attn_q.weight", "v.blk.0.attn_z.weight"], 0)
