"""Real model sources for the model-set tests: the default SmolLM2 GGUF under any name (a
copy of the file, so each name is its own file and its own load)."""
from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from engine.config import EngineConfig
from engine.execution.executor import ModelExecutor
from engine.execution.text.tokenizer import Tokenizer, gguf_tokenizer_dir
from engine.models import LoadedModel, ModelSource


def gguf_source(name: str, path: Path, config: EngineConfig, cache: Path,
                loads: list[str] | None = None) -> ModelSource:
    """A ModelSource that loads `path` for real (executor, KV pool); `loads` records loads."""
    def open_tokenizer() -> Tokenizer:
        return Tokenizer(gguf_tokenizer_dir(path, cache))

    def load() -> LoadedModel:
        if loads is not None:
            loads.append(name)
        ex = ModelExecutor.from_pretrained(path, config, cache_dir=cache, progress=False)
        cfg = dataclasses.replace(config, max_context=min(config.max_context, ex.max_context))
        return LoadedModel(ex, cfg, ex.describe(), ex.footprint(in_use=True).total)

    return ModelSource(name, open_tokenizer, load, path.stat().st_size,
                       {"architecture": "llama", "format": "GGUF", "path": str(path)})


def copy_model(model: Path, folder: Path, name: str) -> Path:
    """The default GGUF copied as `name`.gguf in `folder` (its own file: its own pages)."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{name}.gguf"
    if not target.exists():
        shutil.copyfile(model, target)
    return target
