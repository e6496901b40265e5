"""Models other tools already downloaded: Ollama's store, LM Studio's folders, the Hugging Face
cache. Found in place and read where they lie (an Ollama model is one GGUF blob, named by
its manifest): nothing is copied.

Ollama's layout (`OLLAMA_MODELS`, else ~/.ollama/models): manifests/<registry>/<namespace>/
<name>/<tag> is an OCI-style JSON manifest whose layer of media type
`application/vnd.ollama.image.model` names the GGUF by digest; the blob is blobs/sha256-<hex>
(older versions: sha256:<hex>). `gemma3:270m` means registry.ollama.ai/library/gemma3/270m;
`user/model:tag` a user namespace, `host/ns/model:tag` another registry; the tag defaults to
`latest`.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

OLLAMA_PREFIX = "ollama:"
OLLAMA_REGISTRY = "registry.ollama.ai"
MODEL_LAYER = "application/vnd.ollama.image.model"


class StoreError(ValueError):
    """A store's model cannot be found or read; the message says what was looked for."""


@dataclass(frozen=True, slots=True)
class StoredModel:
    name: str  # how --model names it: ollama:gemma3:270m, or a path
    path: Path  # the GGUF file (an Ollama blob), or a model folder
    size: int
    store: str  # "ollama", "lm studio", "hugging face cache"


def ollama_dir(env: Mapping[str, str] | None = None) -> Path:
    environ = os.environ if env is None else env
    if environ.get("OLLAMA_MODELS"):
        return Path(environ["OLLAMA_MODELS"]).expanduser()
    return Path(environ.get("HOME", str(Path.home()))) / ".ollama" / "models"


def _manifest_path(name: str) -> tuple[str, Path]:
    """'gemma3:270m' -> ('gemma3:270m', manifests-relative path); the tag defaults to latest."""
    repo, _, tag = name.partition(":")
    if not repo or "/" in tag or ".." in repo.split("/") or repo.startswith("/"):
        raise StoreError(f"{OLLAMA_PREFIX}{name} is not an Ollama model name (NAME[:TAG])")
    tag = tag or "latest"
    parts = repo.split("/")
    if len(parts) == 1:
        parts = [OLLAMA_REGISTRY, "library", *parts]
    elif len(parts) == 2:
        parts = [OLLAMA_REGISTRY, *parts]
    return f"{repo}:{tag}", Path(*parts, tag)


def _blob(models: Path, digest: str) -> Path:
    algo, _, hexdigest = digest.partition(":")
    for name in (f"{algo}-{hexdigest}", f"{algo}:{hexdigest}"):
        if (models / "blobs" / name).is_file():
            return models / "blobs" / name
    raise StoreError(f"Ollama's blob {digest} is missing from {models / 'blobs'}")


def _model_blob(models: Path, manifest: Path) -> Path:
    try:
        layers = json.loads(manifest.read_text(encoding="utf-8")).get("layers", [])
        digest = next(layer["digest"] for layer in layers
                      if layer.get("mediaType") == MODEL_LAYER)
    except (OSError, ValueError, AttributeError, KeyError, TypeError, StopIteration):
        raise StoreError(f"{manifest} is not an Ollama manifest with a model layer") from None
    return _blob(models, str(digest))


def resolve_ollama(name: str, env: Mapping[str, str] | None = None) -> StoredModel:
    """`ollama:NAME[:TAG]` (the prefix optional) -> the GGUF blob its manifest names."""
    name = name.removeprefix(OLLAMA_PREFIX)
    models = ollama_dir(env)
    full, rel = _manifest_path(name)
    manifest = models / "manifests" / rel
    if not manifest.is_file():
        known = ", ".join(m.name for m in ollama_models(env)) or "none"
        raise StoreError(f"Ollama has no model {full} in {models} (found: {known}); "
                         f"`ollama pull {full}` fetches it")
    blob = _model_blob(models, manifest)
    return StoredModel(OLLAMA_PREFIX + full, blob, blob.stat().st_size, "ollama")


def ollama_models(env: Mapping[str, str] | None = None) -> list[StoredModel]:
    models = ollama_dir(env)
    root = models / "manifests"
    found = []
    for manifest in sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else []:
        parts = manifest.relative_to(root).parts
        if len(parts) < 3:
            continue
        if parts[0] == OLLAMA_REGISTRY and parts[1] == "library":
            repo = "/".join(parts[2:-1])
        elif parts[0] == OLLAMA_REGISTRY:
            repo = "/".join(parts[1:-1])
        else:
            repo = "/".join(parts[:-1])
        try:
            blob = _model_blob(models, manifest)
        except StoreError:
            continue  # a half-pulled model: Ollama itself lists it as missing
        found.append(StoredModel(f"{OLLAMA_PREFIX}{repo}:{parts[-1]}", blob,
                                 blob.stat().st_size, "ollama"))
    return found


def _ggufs_under(folder: Path, store: str, depth: int) -> Iterator[StoredModel]:
    """GGUF files up to `depth` folders down (LM Studio keeps publisher/repo/file.gguf)."""
    if not folder.is_dir():
        return
    for level in range(depth):
        for path in sorted(folder.glob("*/" * level + "*.gguf")):
            if path.is_file() and "mmproj" not in path.name.lower():  # vision projectors
                yield StoredModel(str(path), path, path.stat().st_size, store)


def lmstudio_models(env: Mapping[str, str] | None = None) -> list[StoredModel]:
    environ = os.environ if env is None else env
    home = Path(environ.get("HOME", str(Path.home())))
    found: list[StoredModel] = []
    for folder in (home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"):
        found.extend(_ggufs_under(folder, "lm studio", 3))
    return found


def hf_cache_models(env: Mapping[str, str] | None = None) -> list[StoredModel]:
    """GGUF files and complete model snapshots in the Hugging Face hub cache."""
    environ = os.environ if env is None else env
    if environ.get("HF_HUB_CACHE"):
        hub = Path(environ["HF_HUB_CACHE"])
    else:
        home = Path(environ.get("HF_HOME") or Path(environ.get("HOME", str(Path.home())))
                    / ".cache" / "huggingface")
        hub = home / "hub"
    found: list[StoredModel] = []
    for repo in sorted(hub.glob("models--*")) if hub.is_dir() else []:
        for snapshot in sorted((repo / "snapshots").glob("*")):
            if (snapshot / "config.json").is_file() and any(snapshot.glob("*.safetensors")):
                size = sum(p.stat().st_size for p in snapshot.glob("*") if p.is_file())
                found.append(StoredModel(str(snapshot), snapshot, size, "hugging face cache"))
            found.extend(_ggufs_under(snapshot, "hugging face cache", 2))
    return found


def stored_models(env: Mapping[str, str] | None = None) -> list[StoredModel]:
    """Everything the three stores hold that could be a model, in store order."""
    return ollama_models(env) + lmstudio_models(env) + hf_cache_models(env)
