"""Files outside a model store are never served (app/model_stores.py): an Ollama digest that is
not sha256:<64 hex>, a blob or GGUF whose symlinks lead out of its store. Each is listed by
`ferry models` with the reason; links that stay inside (the Hugging Face cache's snapshots ->
blobs, a store folder that is itself a link) are served. Real files: the default model's GGUF,
hard-linked into the stores the test builds."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from app.commands.models import describe
from app.discovery import found_models
from app.model_stores import (
    StoreError,
    hf_cache_models,
    lmstudio_models,
    ollama_models,
    refused_models,
    resolve_ollama,
)
from app.models import ModelError, resolve_model
from app.paths import get_paths
from app.settings import Settings


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FERRY_HOME", str(tmp_path / "ferry"))
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    return tmp_path


@pytest.fixture(scope="module")
def gguf() -> Path:
    from app.models import default_gguf

    path = default_gguf()
    assert path is not None, "the default model must be installed"
    return path


def place(src: Path, dst: Path) -> Path:
    """`src`'s bytes at `dst`, a file of the store (a hard link: no symlink, no copy)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:  # another file system
        shutil.copyfile(src, dst)
    return dst


def manifest(models: Path, name: str, digest: str) -> Path:
    path = models / "manifests/registry.ollama.ai/library" / name.replace(":", "/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"layers": [
        {"mediaType": "application/vnd.ollama.image.model", "digest": digest}]}))
    return path


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_digest_must_be_sha256_hex(home: Path, gguf: Path) -> None:
    models = home / "ollama"
    hexdigest = sha(gguf)
    place(gguf, models / "blobs" / f"sha256-{hexdigest}")
    manifest(models, "good:1", f"sha256:{hexdigest}")
    manifest(models, "path:1", str(gguf))  # an absolute path as the digest
    manifest(models, "dots:1", "sha256:../../../" + str(gguf))
    manifest(models, "upper:1", f"sha256:{hexdigest.upper()}")
    manifest(models, "short:1", f"sha256:{hexdigest[:63]}")
    manifest(models, "number:1", 7)  # type: ignore[arg-type]
    assert [m.name for m in ollama_models()] == ["ollama:good:1"]
    refused = {m.name: m.reason for m in refused_models()}
    assert set(refused) == {f"ollama:{n}:1" for n in ("path", "dots", "upper", "short",
                                                       "number")}
    assert all("is not sha256:<64 lowercase hex>" in r or "not a string" in r
               for r in refused.values()), refused
    with pytest.raises(StoreError, match="not sha256"):
        resolve_ollama("path:1")
    with pytest.raises(ModelError, match="not sha256"):
        resolve_model("ollama:path:1")  # --model refuses it too
    # never offered: discovery serves only what the store may serve
    assert [m.name for m in found_models([], [])] == ["good:1"]
    text = "\n".join(describe(Settings(), get_paths()))
    refused_part = text.split("Refused (never served)")[1]
    assert "ollama:path:1" in refused_part and "refused: the manifest's model layer digest" \
        in refused_part


def test_an_ollama_blob_that_links_out_is_refused(home: Path, gguf: Path) -> None:
    models = home / "ollama"
    hexdigest = sha(gguf)
    blob = models / "blobs" / f"sha256-{hexdigest}"
    blob.parent.mkdir(parents=True)
    blob.symlink_to(gguf)  # a real GGUF, outside the store
    manifest(models, "out:1", f"sha256:{hexdigest}")
    assert ollama_models() == []
    [bad] = refused_models()
    assert bad.name == "ollama:out:1" and "links outside" in bad.reason
    with pytest.raises(StoreError, match="links outside"):
        resolve_ollama("out:1")
    assert found_models([], []) == []
    # a link that stays in the blobs folder (here: to a copy under another name) is served
    blob.unlink()
    place(gguf, models / "blobs" / "elsewhere")
    blob.symlink_to("elsewhere")
    assert [m.name for m in ollama_models()] == ["ollama:out:1"] and refused_models() == []


def test_a_store_folder_that_is_a_link_is_its_own_root(home: Path, gguf: Path) -> None:
    """Ollama's blobs on another disk, LM Studio's models folder moved: the links that make
    the store are followed; only what leads out of the resolved store is refused."""
    disk = home / "disk"
    hexdigest = sha(gguf)
    place(gguf, disk / "blobs" / f"sha256-{hexdigest}")
    (home / "ollama").mkdir()
    (home / "ollama/blobs").symlink_to(disk / "blobs")
    manifest(home / "ollama", "moved:1", f"sha256:{hexdigest}")
    place(gguf, disk / "lms/pub/repo/model.gguf")
    (home / "home/.lmstudio").mkdir(parents=True)
    (home / "home/.lmstudio/models").symlink_to(disk / "lms")
    assert [m.name for m in ollama_models()] == ["ollama:moved:1"]
    assert [Path(m.path).name for m in lmstudio_models()] == ["model.gguf"]
    assert refused_models() == []


def test_lm_studio_gguf_that_links_out_is_refused(home: Path, gguf: Path) -> None:
    lms = home / "home/.lmstudio/models/pub/repo"
    place(gguf, lms / "inside.gguf")
    lms.joinpath("outside.gguf").symlink_to(gguf)
    assert [Path(m.path).name for m in lmstudio_models()] == ["inside.gguf"]
    [bad] = refused_models()
    assert bad.store == "lm studio" and bad.path == lms / "outside.gguf"
    assert "links outside" in bad.reason
    assert [m.name for m in found_models([], [])] == ["inside"]


def test_hf_cache_links_into_its_blobs_are_served(home: Path, gguf: Path) -> None:
    """The cache's own layout: snapshots/<rev>/<file> -> ../../blobs/<hash>, inside one repo
    folder of the hub cache. Held to the hub folder, not the snapshot."""
    hub = home / "home/.cache/huggingface/hub"
    repo = hub / "models--org--tiny-GGUF"
    place(gguf, repo / "blobs" / sha(gguf))
    snap = repo / "snapshots/abc"
    snap.mkdir(parents=True)
    (snap / "tiny.Q4.gguf").symlink_to(Path("../../blobs") / sha(gguf))
    folder = hub / "models--org--small/snapshots/def"
    folder.mkdir(parents=True)
    for name, data in (("config.json", b"{}"), ("model.safetensors", b"x")):
        blob = hub / "models--org--small/blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        (folder / name).symlink_to(Path("../../blobs") / blob.name)
    assert [Path(m.path).name for m in hf_cache_models()] == ["def", "tiny.Q4.gguf"]
    assert refused_models() == []
    # a snapshot file that leads out of the cache: the GGUF, and the whole model folder
    (snap / "other.gguf").symlink_to(gguf)
    (folder / "tokenizer.json").symlink_to(gguf)
    assert [Path(m.path).name for m in hf_cache_models()] == ["tiny.Q4.gguf"]
    reasons = {Path(m.path).name: m.reason for m in refused_models()}
    assert set(reasons) == {"other.gguf", "def"}
    assert all("links outside" in r for r in reasons.values())
    assert [m.name for m in found_models([], [])] == ["tiny.Q4"]
