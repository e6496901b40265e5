"""Models other tools already downloaded: Ollama's store, LM Studio's folders, the Hugging Face
cache. Found in place and read where they lie (an Ollama model is one GGUF blob, named by
its manifest): nothing is copied.

Ollama's layout (`OLLAMA_MODELS`, else ~/.ollama/models): manifests/<registry>/<namespace>/
<name>/<tag> is an OCI-style JSON manifest whose layer of media type
`application/vnd.ollama.image.model` names the GGUF by digest; the blob is blobs/sha256-<hex>
(older versions: sha256:<hex>). `gemma3:270m` means registry.ollama.ai/library/gemma3/270m;
`user/model:tag` a user namespace, `host/ns/model:tag` another registry; the tag defaults to
`latest`. A vision model's manifest also has a layer of media type
`application/vnd.ollama.image.projector`: its projector file (llama.cpp's mmproj), a blob too.

A store's file is served only when it lies inside the store: an Ollama layer's digest must be
`sha256:<64 lowercase hex>` (never a path), and every file, symlinks resolved, must lie under
the store's resolved root (Ollama's blobs folder, LM Studio's models folder, the Hugging Face
hub cache, whose snapshots link into the same cache's blobs). Anything else is refused: listed
with the reason by `ferry models` (refused_models), never served.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

OLLAMA_PREFIX = "ollama:"
OLLAMA_REGISTRY = "registry.ollama.ai"
MODEL_LAYER = "application/vnd.ollama.image.model"
PROJECTOR_LAYER = "application/vnd.ollama.image.projector"  # a vision model's (llama.cpp's)
DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")


class StoreError(ValueError):
    """A store's model cannot be found or read; the message says what was looked for."""


@dataclass(frozen=True, slots=True)
class StoredModel:
    name: str  # how --model names it: ollama:gemma3:270m, or a path
    path: Path  # the GGUF file (an Ollama blob), or a model folder
    size: int
    store: str  # "ollama", "lm studio", "hugging face cache"
    projector: Path | None = None  # an Ollama vision model's projector blob


@dataclass(frozen=True, slots=True)
class RefusedModel:
    """A store's entry that is never served: a broken manifest, a file outside its store."""

    name: str  # as StoredModel.name
    path: Path  # the manifest, file or folder that names it
    reason: str
    store: str


def inside(path: Path, root: Path) -> bool:
    """Whether `path`, every symlink resolved, lies under `root` (resolved too)."""
    try:
        return path.resolve(strict=True).is_relative_to(root.resolve(strict=True))
    except (OSError, RuntimeError):  # missing, unreadable, a symlink loop
        return False


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
    if not DIGEST_RE.fullmatch(digest):
        raise StoreError(f"the manifest's model layer digest {digest[:80]!r} is not "
                         "sha256:<64 lowercase hex>")
    algo, _, hexdigest = digest.partition(":")
    blobs = models / "blobs"
    for name in (f"{algo}-{hexdigest}", f"{algo}:{hexdigest}"):
        if (blobs / name).is_file():
            if not inside(blobs / name, blobs):
                raise StoreError(f"Ollama's blob {digest} links outside {blobs}")
            return blobs / name
    raise StoreError(f"Ollama's blob {digest} is missing from {blobs}")


def _model_blob(models: Path, manifest: Path) -> tuple[Path, Path | None]:
    """The manifest's model blob, and its projector blob (a vision model's) or None."""
    try:
        layers = json.loads(manifest.read_text(encoding="utf-8")).get("layers", [])
        digest = next(layer["digest"] for layer in layers
                      if layer.get("mediaType") == MODEL_LAYER)
        projector = next((layer["digest"] for layer in layers
                          if layer.get("mediaType") == PROJECTOR_LAYER), None)
    except (OSError, ValueError, AttributeError, KeyError, TypeError, StopIteration):
        raise StoreError(f"{manifest} is not an Ollama manifest with a model layer") from None
    for kind, value in (("model", digest), ("projector", projector)):
        if value is not None and not isinstance(value, str):
            raise StoreError(f"the manifest's {kind} layer digest {value!r} is not a string")
    return _blob(models, digest), None if projector is None else _blob(models, projector)


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
    blob, projector = _model_blob(models, manifest)
    return StoredModel(OLLAMA_PREFIX + full, blob, blob.stat().st_size, "ollama", projector)


def _ollama(env: Mapping[str, str] | None) -> Iterator[StoredModel | RefusedModel]:
    models = ollama_dir(env)
    root = models / "manifests"
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
        name = f"{OLLAMA_PREFIX}{repo}:{parts[-1]}"
        try:
            blob, projector = _model_blob(models, manifest)
        except StoreError as exc:  # a half-pulled model, or one naming a file outside
            yield RefusedModel(name, manifest, str(exc), "ollama")
            continue
        yield StoredModel(name, blob, blob.stat().st_size, "ollama", projector)


def ollama_models(env: Mapping[str, str] | None = None) -> list[StoredModel]:
    return [m for m in _ollama(env) if isinstance(m, StoredModel)]


def _ggufs_under(folder: Path, store: str, depth: int,
                 root: Path) -> Iterator[StoredModel | RefusedModel]:
    """GGUF files up to `depth` folders down (LM Studio keeps publisher/repo/file.gguf); one
    that resolves outside `root` is refused."""
    if not folder.is_dir():
        return
    for level in range(depth):
        for path in sorted(folder.glob("*/" * level + "*.gguf")):
            if not path.is_file() or "mmproj" in path.name.lower():  # vision projectors
                continue
            if inside(path, root):
                yield StoredModel(str(path), path, path.stat().st_size, store)
            else:
                yield RefusedModel(str(path), path, f"{path} links outside {root}", store)


def _lmstudio(env: Mapping[str, str] | None) -> Iterator[StoredModel | RefusedModel]:
    environ = os.environ if env is None else env
    home = Path(environ.get("HOME", str(Path.home())))
    for folder in (home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"):
        yield from _ggufs_under(folder, "lm studio", 3, folder)


def lmstudio_models(env: Mapping[str, str] | None = None) -> list[StoredModel]:
    return [m for m in _lmstudio(env) if isinstance(m, StoredModel)]


def _hf_cache(env: Mapping[str, str] | None) -> Iterator[StoredModel | RefusedModel]:
    """GGUF files and complete model snapshots in the Hugging Face hub cache; a snapshot's
    files link to the cache's blobs, so they are held to the hub folder, not the snapshot."""
    environ = os.environ if env is None else env
    if environ.get("HF_HUB_CACHE"):
        hub = Path(environ["HF_HUB_CACHE"])
    else:
        home = Path(environ.get("HF_HOME") or Path(environ.get("HOME", str(Path.home())))
                    / ".cache" / "huggingface")
        hub = home / "hub"
    store = "hugging face cache"
    for repo in sorted(hub.glob("models--*")) if hub.is_dir() else []:
        for snapshot in sorted((repo / "snapshots").glob("*")):
            if (snapshot / "config.json").is_file() and any(snapshot.glob("*.safetensors")):
                every = [p for p in [snapshot, *snapshot.rglob("*")] if p.exists()]
                outside = next((p for p in every if not inside(p, hub)), None)
                if outside is None:
                    size = sum(p.stat().st_size for p in snapshot.glob("*") if p.is_file())
                    yield StoredModel(str(snapshot), snapshot, size, store)
                else:
                    yield RefusedModel(str(snapshot), snapshot,
                                       f"{outside} links outside {hub}", store)
            yield from _ggufs_under(snapshot, store, 2, hub)


def hf_cache_models(env: Mapping[str, str] | None = None) -> list[StoredModel]:
    return [m for m in _hf_cache(env) if isinstance(m, StoredModel)]


def stored_models(env: Mapping[str, str] | None = None) -> list[StoredModel]:
    """Everything the three stores hold that could be a model, in store order."""
    return ollama_models(env) + lmstudio_models(env) + hf_cache_models(env)


def refused_models(env: Mapping[str, str] | None = None) -> list[RefusedModel]:
    """What the three stores hold but Ferry never serves, each with the reason."""
    every = [*_ollama(env), *_lmstudio(env), *_hf_cache(env)]
    return [m for m in every if isinstance(m, RefusedModel)]
