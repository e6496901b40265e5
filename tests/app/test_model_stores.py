"""Other tools' model stores (app/model_stores.py), built in the test with their real layouts:
Ollama's manifests and blobs, LM Studio's publisher/repo folders, the Hugging Face cache."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from app.commands.models import describe
from app.model_stores import StoreError, ollama_models, resolve_ollama, stored_models
from app.models import ModelError, resolve_model
from app.paths import get_paths
from app.settings import Settings

GGUF_BYTES = b"GGUF\x03\x00\x00\x00" + b"\x00" * 56  # a header is enough to be found


def add_ollama(models: Path, repo_path: str, tag: str, payload: bytes,
               colon_blob: bool = False) -> Path:
    """Pull as Ollama does: the blob by digest, the manifest naming it (and other layers)."""
    digest = hashlib.sha256(payload).hexdigest()
    blobs = models / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    blob = blobs / (f"sha256:{digest}" if colon_blob else f"sha256-{digest}")
    blob.write_bytes(payload)
    template = b"{{ .Prompt }}"
    (blobs / f"sha256-{hashlib.sha256(template).hexdigest()}").write_bytes(template)
    manifest = models / "manifests" / repo_path / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                   "digest": "sha256:" + "0" * 64, "size": 2},
        "layers": [
            {"mediaType": "application/vnd.ollama.image.template",
             "digest": f"sha256:{hashlib.sha256(template).hexdigest()}", "size": len(template)},
            {"mediaType": "application/vnd.ollama.image.model",
             "digest": f"sha256:{digest}", "size": len(payload)},
        ]}))
    return blob


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    models = tmp_path / "ollama-models"
    monkeypatch.setenv("OLLAMA_MODELS", str(models))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    return models


def test_ollama_name_resolves_to_the_blob_in_place(store: Path) -> None:
    blob = add_ollama(store, "registry.ollama.ai/library/gemma3", "270m", GGUF_BYTES + b"a")
    got = resolve_ollama("ollama:gemma3:270m")
    assert got.path == blob and got.size == len(GGUF_BYTES) + 1
    assert got.name == "ollama:gemma3:270m"
    ref = resolve_model("ollama:gemma3:270m")  # what --model does
    assert (ref.kind, ref.name, ref.path) == ("gguf", "gemma3:270m", blob)


def test_an_ollama_vision_model_brings_its_projector_layer(store: Path) -> None:
    """A vision model's manifest has a projector layer (a blob too): it goes with the model
    to the loader (--model and the picker alike); a projector naming a missing blob is a
    refused pull."""
    blob = add_ollama(store, "registry.ollama.ai/library/gemma3", "4b", GGUF_BYTES + b"m")
    projector = GGUF_BYTES + b"projector"
    digest = hashlib.sha256(projector).hexdigest()
    (store / "blobs" / f"sha256-{digest}").write_bytes(projector)
    manifest = store / "manifests" / "registry.ollama.ai/library/gemma3/4b"
    fields = json.loads(manifest.read_text())
    fields["layers"].append({"mediaType": "application/vnd.ollama.image.projector",
                             "digest": f"sha256:{digest}", "size": len(projector)})
    manifest.write_text(json.dumps(fields))
    got = resolve_ollama("gemma3:4b")
    assert (got.path, got.projector) == (blob, store / "blobs" / f"sha256-{digest}")
    assert resolve_model("ollama:gemma3:4b").projector == got.projector
    assert [m.projector for m in ollama_models()] == [got.projector]
    (store / "blobs" / f"sha256-{digest}").unlink()
    with pytest.raises(StoreError, match="missing"):
        resolve_ollama("gemma3:4b")


def test_tag_defaults_to_latest_and_namespaces(store: Path) -> None:
    latest = add_ollama(store, "registry.ollama.ai/library/qwen3", "latest", GGUF_BYTES + b"b")
    user = add_ollama(store, "registry.ollama.ai/alice/tiny", "q4", GGUF_BYTES + b"c",
                      colon_blob=True)  # older Ollama named blobs sha256:<hex>
    other = add_ollama(store, "hf.co/org/repo-GGUF", "Q4_K_M", GGUF_BYTES + b"d")
    assert resolve_ollama("qwen3").path == latest
    assert resolve_ollama("alice/tiny:q4").path == user
    assert resolve_ollama("hf.co/org/repo-GGUF:Q4_K_M").path == other
    assert [m.name for m in ollama_models()] == [
        "ollama:hf.co/org/repo-GGUF:Q4_K_M",
        "ollama:alice/tiny:q4", "ollama:qwen3:latest"]


def test_unknown_model_lists_the_known_ones(store: Path) -> None:
    add_ollama(store, "registry.ollama.ai/library/gemma3", "270m", GGUF_BYTES)
    with pytest.raises(StoreError, match=r"no model gemma3:1b .*found: ollama:gemma3:270m"):
        resolve_ollama("ollama:gemma3:1b")
    with pytest.raises(ModelError, match="ollama pull gemma3:1b"):
        resolve_model("ollama:gemma3:1b")
    with pytest.raises(StoreError, match="not an Ollama model name"):
        resolve_ollama("ollama:../../etc:x")


def test_broken_pulls_say_what_is_missing(store: Path) -> None:
    blob = add_ollama(store, "registry.ollama.ai/library/gemma3", "270m", GGUF_BYTES)
    blob.unlink()
    with pytest.raises(StoreError, match=r"blob sha256:[0-9a-f]{64} is missing"):
        resolve_ollama("gemma3:270m")
    assert ollama_models() == []  # listed by nobody until it is whole
    bad = store / "manifests/registry.ollama.ai/library/junk/latest"
    bad.parent.mkdir(parents=True)
    bad.write_text("not json")
    with pytest.raises(StoreError, match="not an Ollama manifest"):
        resolve_ollama("junk")


def test_lm_studio_and_hf_cache_are_found(store: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    lms = home / ".lmstudio/models/lmstudio-community/gemma-3-270m-GGUF"
    lms.mkdir(parents=True)
    (lms / "gemma-3-270m-Q4_K_M.gguf").write_bytes(GGUF_BYTES)
    (lms / "mmproj-model-f16.gguf").write_bytes(GGUF_BYTES)  # a vision projector: not a model
    snap = home / ".cache/huggingface/hub/models--org--tiny/snapshots/abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    (snap / "model.safetensors").write_bytes(b"x")
    (snap / "tiny.Q8_0.gguf").write_bytes(GGUF_BYTES)
    add_ollama(store, "registry.ollama.ai/library/gemma3", "270m", GGUF_BYTES)
    found = [(m.store, Path(m.path).name) for m in stored_models()]
    assert found == [("ollama", found[0][1]), ("lm studio", "gemma-3-270m-Q4_K_M.gguf"),
                     ("hugging face cache", "abc123"), ("hugging face cache", "tiny.Q8_0.gguf")]
    text = "\n".join(describe(Settings(), get_paths()))
    assert "ollama:gemma3:270m" in text and "gemma-3-270m-Q4_K_M.gguf" in text


@pytest.mark.model
def test_an_ollama_blob_runs_in_place(store: Path) -> None:
    """The engine reads a GGUF stored without its suffix (Ollama's sha256-<hex> blob): it
    describes, tokenizes and decodes as the same file under its own name."""
    from engine import EngineConfig, ModelExecutor, Tokenizer, describe_model_file
    from engine.execution.loading.loader import default_gguf_path
    from engine.scheduling.request import Request, SamplingParams
    from tests.engine.execution.test_default_model import greedy_until_eos

    gguf = default_gguf_path()
    digest = hashlib.sha256(gguf.read_bytes()).hexdigest()
    (store / "blobs").mkdir(parents=True)
    blob = store / "blobs" / f"sha256-{digest}"
    try:  # a file of the store (a symlink out of it is refused), not a copy where it can be
        os.link(gguf, blob)
    except OSError:
        shutil.copyfile(gguf, blob)
    manifest = store / "manifests/registry.ollama.ai/library/smollm2/135m"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"layers": [{"mediaType": "application/vnd.ollama.image.model",
                                                "digest": f"sha256:{digest}"}]}))
    ref = resolve_model("ollama:smollm2:135m")
    assert ref.path == blob and ref.path.suffix == ""
    assert describe_model_file(blob, "auto", "cpu", "none") == \
        describe_model_file(gguf, "auto", "cpu", "none")
    outputs = []
    for path in (blob, gguf):
        tok = Tokenizer(path)
        ex = ModelExecutor.from_pretrained(path, EngineConfig(page_size=16, kv_tokens=256),
                                           dtype="auto", threads=1)
        req = Request(tok.apply_chat_template([{"role": "user", "content": "Hi!"}]),
                      SamplingParams(max_tokens=6))
        req.pages = list(range(4))
        greedy_until_eos(ex, req)
        outputs.append(req.output_ids)
    assert outputs[0] == outputs[1] and len(outputs[0]) >= 1
