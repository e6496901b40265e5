"""Models found on disk (app/discovery.py): listed from stores built in the test with their
real layouts, configured ones left out, broken places skipped, and whether Ferry runs each
(a GGUF of random weights written by tests/tools/hf_gguf.py holds no tokenizer)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from app.cli import build_parser, serve_flags
from app.commands.models import describe
from app.config_sources import load_settings
from app.discovery import cannot_run, found_models, start_discovery
from app.models import ModelRef
from app.paths import get_paths
from app.settings import Settings
from tests.app.test_model_stores import GGUF_BYTES, add_ollama


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    return tmp_path


def weights_only_gguf(path: Path) -> Path:
    """A real llama GGUF (random weights, hf_gguf's llama.cpp layout) without a tokenizer."""
    import transformers

    from tests.tools.hf_gguf import write_gguf

    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=1, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)
    write_gguf(path, transformers.LlamaForCausalLM(cfg))
    return path


def test_found_models_name_each_once_and_skip_the_configured(home: Path) -> None:
    ollama = home / "ollama"
    add_ollama(ollama, "registry.ollama.ai/library/gemma3", "270m", GGUF_BYTES + b"a")
    taken = add_ollama(ollama, "registry.ollama.ai/library/qwen3", "0.6b", GGUF_BYTES + b"b")
    lms = home / "home/.lmstudio/models/pub/repo-GGUF"
    lms.mkdir(parents=True)
    (lms / "tiny-Q4.gguf").write_bytes(GGUF_BYTES)
    snap = home / "home/.cache/huggingface/hub/models--org--small/snapshots/abc"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    (snap / "model.safetensors").write_bytes(b"x")
    folder = home / "mine"
    folder.mkdir()
    (folder / "tiny-Q4.gguf").write_bytes(GGUF_BYTES + b"c")  # the same name as LM Studio's
    (folder / "mine.gguf").write_bytes(GGUF_BYTES + b"d")
    configured = [ModelRef("gguf", "mine", folder / "mine.gguf"),  # by name
                  ModelRef("gguf", "anything", taken)]  # by path
    found = found_models([str(folder), str(home / "missing")], configured)
    assert [(m.name, m.store) for m in found] == [
        ("tiny-Q4", "model folder"), ("gemma3:270m", "ollama"),
        ("org/small", "hugging face cache")]
    assert found[0].ref.kind == "gguf" and found[2].ref.kind == "folder"


def test_broken_places_are_skipped_not_fatal(home: Path) -> None:
    ollama = home / "ollama"
    add_ollama(ollama, "registry.ollama.ai/library/ok", "latest", GGUF_BYTES)
    junk = ollama / "manifests/registry.ollama.ai/library/junk/latest"
    junk.parent.mkdir(parents=True)
    junk.write_text("not json")
    (ollama / "manifests/registry.ollama.ai/library/gone").mkdir()
    (ollama / "manifests/registry.ollama.ai/library/gone/1b").symlink_to(home / "nowhere")
    lms = home / "home/.lmstudio/models/pub/repo"
    lms.mkdir(parents=True)
    (lms / "dangling.gguf").symlink_to(home / "nowhere.gguf")
    (lms / "loop").symlink_to(lms)  # a folder that contains itself
    not_a_folder = home / "file.txt"
    not_a_folder.write_text("x")
    found = found_models([str(not_a_folder)], [])
    assert [m.name for m in found] == ["ok:latest"]


@pytest.mark.model
def test_cannot_run_says_why(home: Path, model_dir: Path) -> None:
    assert cannot_run(model_dir) is None  # the default SmolLM2 GGUF
    weights = weights_only_gguf(home / "weights.gguf")
    assert "holds no tokenizer" in (cannot_run(weights) or "")
    (home / "header.gguf").write_bytes(GGUF_BYTES)
    assert cannot_run(home / "header.gguf") is not None


@pytest.mark.model
def test_ferry_models_says_which_stored_models_run(home: Path, model_dir: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERRY_HOME", str(home / "ferry"))
    ollama = home / "ollama"
    blob = add_ollama(ollama, "registry.ollama.ai/library/smol", "135m", b"placeholder")
    blob.unlink()
    shutil.copyfile(model_dir, blob)
    lms = home / "home/.lmstudio/models/pub/repo"
    lms.mkdir(parents=True)
    weights_only_gguf(lms / "weights.gguf")
    text = "\n".join(describe(Settings(), get_paths()))
    smol = text.split("ollama:smol:135m")[1]
    assert smol.splitlines()[1].strip() == "runs: llama"
    assert f"cannot run: {lms / 'weights.gguf'} holds no tokenizer" in text
    assert "Serving models found on disk: on" in text
    off = "\n".join(describe(Settings(discover_models=False), get_paths()))
    assert "Serving models found on disk: off" in off


def test_discovery_adds_what_runs_on_its_own_thread(home: Path) -> None:
    add_ollama(home / "ollama", "registry.ollama.ai/library/a", "1", GGUF_BYTES + b"1")
    add_ollama(home / "ollama", "registry.ollama.ai/library/b", "1", GGUF_BYTES + b"2")
    found = found_models([], [])
    added: list[str] = []

    def add(model: object) -> str | None:
        name = model.name  # type: ignore[attr-defined]
        if name == "a:1":
            raise OSError("unreadable")  # one failure never stops the others
        added.append(name)
        return None

    thread = start_discovery(found, add)
    thread.join(10)
    assert thread.name == "ferry-discover" and added == ["b:1"]


def test_discovery_setting_from_flag_and_file(tmp_path: Path) -> None:
    def settings(argv: list[str], toml: str = "") -> Settings:
        (tmp_path / "ferry.toml").write_text(toml)
        args = build_parser().parse_args(["serve", *argv])
        return load_settings(serve_flags(args), env={"FERRY_HOME": str(tmp_path)},
                             config_file=tmp_path / "ferry.toml")

    assert settings([]).discover_models is True
    assert settings(["--no-discover"]).discover_models is False
    assert settings([], "discover_models = false\n").discover_models is False
    assert json.dumps(settings(["--discover"], "discover_models = false\n").discover_models) \
        == "true"


def test_serve_adds_the_found_models_unless_discovery_is_off(home: Path) -> None:
    from app.discovery import models_to_serve

    add_ollama(home / "ollama", "registry.ollama.ai/library/a", "1", GGUF_BYTES)
    configured = home / "mine.gguf"
    configured.write_bytes(GGUF_BYTES + b"x")
    refs, found = models_to_serve(Settings(model=str(configured)))
    assert [r.name for r in refs] == ["mine"] and [f.name for f in found] == ["a:1"]
    refs, found = models_to_serve(Settings(model=str(configured), discover_models=False))
    assert [r.name for r in refs] == ["mine"] and found == []
