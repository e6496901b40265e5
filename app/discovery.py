"""Models found on disk, served beside the configured ones: the places `ferry models` looks
(model_folders, Ollama's store, LM Studio's folders, the Hugging Face cache).

Listing is a walk of folders and manifests (no file is opened beyond Ollama's small
manifests), done at start; whether Ferry runs each one (its architecture, a tokenizer)
means reading its metadata, done on a thread of its own after the start ("ferry-discover"),
so a large store never delays serving. A folder that cannot be read is skipped, never an
error. Models Ferry cannot run are not served: `ferry models` lists them with the reason.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from app.model_stores import (
    OLLAMA_PREFIX,
    StoredModel,
    hf_cache_models,
    lmstudio_models,
    ollama_models,
)
from app.models import ModelRef, scan_folder
from app.settings import Settings

log = logging.getLogger(__name__)
FOLDER_STORE = "model folder"


@dataclass(frozen=True, slots=True)
class FoundModel:
    name: str  # as served and picked: gemma3:270m, a file's stem, org/name
    path: Path
    size: int
    store: str  # "model folder", "ollama", "lm studio", "hugging face cache"
    projector: Path | None = None  # an Ollama vision model's projector blob

    @property
    def ref(self) -> ModelRef:
        return ModelRef("gguf" if self.path.is_file() else "folder", self.name, self.path,
                        self.projector)


def served_name(model: StoredModel) -> str:
    """Ollama's NAME:TAG (as --model ollama:NAME:TAG serves it), a file's stem, or a Hugging
    Face cache snapshot's org/name."""
    if model.name.startswith(OLLAMA_PREFIX):
        return model.name.removeprefix(OLLAMA_PREFIX)
    if model.path.is_dir():
        repo = model.path.parent.parent.name  # models--org--name/snapshots/<hash>
        if repo.startswith("models--"):
            return repo.removeprefix("models--").replace("--", "/")
        return model.path.name
    return model.path.stem


def _safely(what: str, walk: Callable[[], Iterable[StoredModel]]) -> list[StoredModel]:
    try:
        return list(walk())
    except OSError as exc:  # an unreadable folder or file: skipped, said in the log
        log.warning("model discovery skipped %s: %s", what, exc)
        return []


def _scan(folder: Path) -> list[StoredModel]:
    if not folder.is_dir():
        return []
    return [StoredModel(e.name, e.path, e.size, FOLDER_STORE) for e in scan_folder(folder)]


def _folder_models(folders: Iterable[str]) -> list[StoredModel]:
    found: list[StoredModel] = []
    for text in folders:
        folder = Path(text).expanduser()
        found += _safely(str(folder), lambda f=folder: _scan(f))  # type: ignore[misc]
    return found


def found_models(folders: Iterable[str], taken: Iterable[ModelRef],
                 env: Mapping[str, str] | None = None) -> list[FoundModel]:
    """Every model on disk not already configured (by name or path), once per name (the
    first place wins: model_folders, Ollama, LM Studio, the Hugging Face cache)."""
    stored = (_folder_models(folders)
              + _safely("Ollama's store", lambda: ollama_models(env))
              + _safely("LM Studio's folders", lambda: lmstudio_models(env))
              + _safely("the Hugging Face cache", lambda: hf_cache_models(env)))
    taken = list(taken)
    names = {r.name for r in taken}
    paths = {r.path.resolve() for r in taken if r.path is not None}
    found: list[FoundModel] = []
    for model in stored:
        name = model.name if model.store == FOLDER_STORE else served_name(model)
        try:
            path = model.path.resolve()
        except OSError:
            continue
        if name in names or path in paths:
            continue
        names.add(name)
        paths.add(path)
        found.append(FoundModel(name, model.path, model.size, model.store, model.projector))
    return found


def cannot_run(path: Path) -> str | None:
    """Why Ferry cannot run this file or folder (its architecture, a missing tokenizer), or
    None when it can. Reads the metadata (a GGUF's header and tensor table, memory-mapped)."""
    from engine import ModelNotFound, model_architecture

    try:
        model_architecture(path)
    except (ModelNotFound, ValueError, KeyError, OSError) as exc:
        return str(exc)
    return None


def start_discovery(found: list[FoundModel], add: Callable[[FoundModel], str | None]) -> \
        threading.Thread:
    """Offer each found model to `add` on a thread of its own; `add` serves it, or returns
    why Ferry cannot run it (logged)."""
    def run() -> None:
        for model in found:
            try:
                problem = add(model)
            except Exception:  # one odd file never stops the others
                log.exception("could not add %s", model.name)
                continue
            if problem is not None:
                log.info("found %s (%s) but cannot run it: %s", model.name, model.store,
                         problem)

    thread = threading.Thread(target=run, name="ferry-discover", daemon=True)
    thread.start()
    return thread


def models_to_serve(settings: Settings) -> tuple[list[ModelRef], list[FoundModel]]:
    """The configured models (the default first) and, unless discover_models is off, the
    others found on disk: a walk of folders (checking each runs after the start)."""
    from app.preflight import served_models

    refs = served_models(settings)
    # a draft model (speculative = "draft") drafts for one model only: none added then
    discover = settings.discover_models and settings.speculative != "draft"
    found = found_models(settings.model_folders, refs) if discover else []
    return refs, found
